"""The SQLite ledger: one file, WAL, group commit (DESIGN §3); see :mod:`.ledger`."""
