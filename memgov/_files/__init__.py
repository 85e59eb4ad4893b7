"""Files another user may plant things beside: checked folders, owned files, locks, whole writes."""
