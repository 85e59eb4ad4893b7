"""The host ledger: record fields, attribution, dead names, records, compaction, admission."""
