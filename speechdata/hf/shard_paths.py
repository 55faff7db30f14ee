"""Where the Hugging Face dataset tells each shard what it holds of it (docs/storage-layout.md).

``shards/<shard>/hf/published-<country>.parquet``: one file per (shard, country), rewritten by
``hf_dataset`` whenever that country is built, so two countries built in parallel never rewrite
each other's file. ``shards/<shard>/rejects/hf_dataset.parquet``: the shard's segments some
country's state filtered out, with the filter's reason. The ``hf`` product line
(:mod:`speechdata.products`) counts the first and owns the rejects of the second.
"""

from __future__ import annotations

import re

from speechdata.io import layout

HF_STAGE = "hf_dataset"
"""The stage whose rejects are the segments the HF states filtered out (``rejects/hf_dataset.parquet``)."""

PUBLISHED_PREFIX = layout.HF_PUBLISHED_PREFIX

COUNTRY_FILE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""A country a published index may be named after: no separator, no dot, no glob character."""


def checked_country(country: str) -> str:
    """``country``, or a ValueError when it cannot name a file (a partition key is user data)."""
    if not isinstance(country, str) or not COUNTRY_FILE_PATTERN.match(country):
        raise ValueError(
            f"country {country!r} cannot name a published index: it must match {COUNTRY_FILE_PATTERN.pattern}"
        )
    return country


def published_index(shard_id: str, country: str) -> str:
    """The shard's utterances that ``country``'s state holds (written, pending, failed), one row each."""
    checked_country(country)
    return f"{layout.shard_dir(shard_id)}/hf/{PUBLISHED_PREFIX}{country}.parquet"


published_index_parts = layout.hf_published_index_parts
