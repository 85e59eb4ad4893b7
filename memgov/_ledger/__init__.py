"""The host ledger: record parsing, attribution, dead names, records, compaction, the device
ledger, wake-ups, counters, admission. Imports _base, _files and _gpu."""
