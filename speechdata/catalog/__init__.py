"""The DuckDB catalog over every shard manifest and rejects ledger."""
