"""The Mimi clock (24 kHz, 12.5 Hz frames), audio decoding, resampling and encoding, and the per-shard
24 kHz audio container."""
