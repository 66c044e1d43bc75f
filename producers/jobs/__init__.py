"""Jobs: submit validation, their SQL, the group-committed insert and the status view."""
