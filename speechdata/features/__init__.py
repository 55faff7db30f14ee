"""Text (Qwen3) and speech (WavLM) features on the bridge's frames, and their per-shard stores."""
