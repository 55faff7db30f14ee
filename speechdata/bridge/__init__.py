"""The 12.5 Hz bridge: the Mimi clock, frame grids, text tokens, WebDataset tars, manifests and the reader."""
