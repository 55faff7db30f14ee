"""Exports of the published samples for trainers: NeMo, Lhotse Shar, moshi-finetune.

``speechdata export nemo|lhotse|moshi --data-root URL --out DIR`` (or ``python -m speechdata.export``);
each reads only published products (shard manifests and bridge tars) and writes a directory
whose paths are relative to itself. docs/exports.md says what each layout is and how each
trainer reads it.
"""
