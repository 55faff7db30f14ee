"""speechdata: the Dagster-free core of the speech data platform.

Pure functions and small classes for the landing contract, audio, alignment, the 12.5 Hz
frame grid, features, packaging, manifests, splits, samplers and loaders. Training code
imports this package without Dagster installed.
"""
