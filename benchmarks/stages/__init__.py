"""Per-stage speed and memory: ingest, resampling, features, frame grids, alignment, VAD, packing, exports."""
