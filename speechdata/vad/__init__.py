"""Silero VAD segments, the per-language shard index and the VAD-chunked streaming loader."""
