"""ASR fine-tuning data: 16 kHz FLAC, manifests, the bucketed sampler and the dataset."""
