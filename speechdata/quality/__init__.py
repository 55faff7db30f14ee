"""Per-utterance quality signals, the policy that turns them into rejects, and the exclusions other
stages read (docs/quality.md). No Dagster here: ``assets/quality.py`` is the thin wrapper."""
