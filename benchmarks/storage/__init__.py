"""What the storage guarantees cost: Parquet page checksums, root confinement, the shard write fence."""
