"""The landing contract, finding landed shards, validating them and normalizing their audio."""
