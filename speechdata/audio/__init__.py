"""Audio decoding, resampling and encoding, and the per-shard 24 kHz audio container."""
