"""The Dagster code location of the speech data platform."""
