"""The 12.5 Hz bridge: frame grids, text tokens, WebDataset tars, manifests and the reader."""
