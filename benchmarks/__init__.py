"""Benchmarks for the ingest stage; ``python -m benchmarks.run_all`` runs them all."""
