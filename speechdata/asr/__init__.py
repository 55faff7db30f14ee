"""ASR fine-tuning data (seed 003): 16 kHz FLAC, manifests, the bucketed sampler and the dataset."""
