"""Dagster resources: they own connections, storage and models, and hand them to assets."""
