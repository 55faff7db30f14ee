"""One importer per source layout (seeds 001, 003, 004, Granary), each producing landing shards."""
