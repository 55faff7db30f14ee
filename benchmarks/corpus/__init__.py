"""Corpus-wide products as the corpus grows: catalog, near-duplicate index, ASR manifests and sampler,
HF splits, language index, publish state, and the whole corpus at scale."""
