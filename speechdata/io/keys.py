"""The keys that become parts of paths under the data root: shard ids, countries, languages,
utterance ids and names; their patterns, and the one validator that refuses the rest by name.
"""

from __future__ import annotations

import re

SHARD_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}$")
"""A shard id is safe as a Dagster partition key, a file name and a WebDataset key prefix."""

PARTITION_VALUE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}$")
"""Countries and languages become partition keys too: plain lowercase ``[a-z0-9_-]``."""

UTT_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
"""An utterance id names files (``<utt>.ctm``, ``<utt>-<sha>.flac``); the landing contract rejects the
rest with its own reasons (``utt_id_has_dot``, ``utt_id_too_long``...)."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""A dataset, stage or split name: one plain path component (no ``/``, never ``.`` or ``..``)."""


class ConfinementError(ValueError):
    """A path built from user data would leave its root. The message names the path, root and rule."""

    def __init__(self, what: str, value: str, root: str, rule: str):
        self.what, self.value, self.root, self.rule = what, value, root, rule
        super().__init__(f"refusing {what} {value!r}: {rule} (root {root!r})")


class InvalidKey(ConfinementError):
    """A partition key or identifier that cannot be a folder or file name under the data root."""


KEY_KINDS: dict[str, tuple[str, re.Pattern[str], str]] = {
    "shard": ("shard id", SHARD_ID_PATTERN, "shards/"),
    "country": ("country", PARTITION_VALUE_PATTERN, "hf/"),
    "language": ("language", PARTITION_VALUE_PATTERN, "language_index/"),
    "utterance": ("utt_id", UTT_ID_PATTERN, "shards/"),
    "dataset": ("dataset name", NAME_PATTERN, "hf/"),
    "name": ("name", NAME_PATTERN, "the data root"),
}
"""Every kind of key that becomes part of a path: what it is called in a refusal, its pattern and the
folder it names. A Dagster partitions definition's name is its kind (``shard``, ``country``,
``language``): every partitioned asset validates its keys against this table before it runs."""

ANY_KEY = "*"
"""Passed for a key, a layout function gives the glob over every key (``shards/*/vad_segments.parquet``)."""

KEY_PLACEHOLDER = "\x00"
"""Passed for a key, a layout function gives a template whose key is found by splitting on it (the
product registry's shard regexes); never a path: :meth:`DataRoot.path` refuses a NUL byte."""


_DISPLAY_PLACEHOLDER = re.compile(r"^<[a-z_]{1,32}>$")
"""``<shard>``, ``<country>``: a layout function asked for the path's shape, for people (docs, logs)."""


def validate_key(kind: str, value: object) -> str:
    """``value`` if it is a valid key of ``kind`` (see :data:`KEY_KINDS`); else :class:`InvalidKey`
    naming it, the rule and the folder it would have named. The one validator of every partition key
    and identifier: where a key enters (sensor, partitioned asset, CLI, importer) and where it becomes
    a path (every function of :mod:`speechdata.io.layout`)."""
    what, pattern, folder = KEY_KINDS[kind]
    if not isinstance(value, str) or not pattern.match(value) or value in (".", ".."):
        article = "an" if what[0] in "aeiou" else "a"
        raise InvalidKey(what, str(value), folder, f"{article} {what} must match {pattern.pattern}")
    return value


def is_valid_key(kind: str, value: object) -> bool:
    try:
        validate_key(kind, value)
    except InvalidKey:
        return False
    return True


def key_segment(kind: str, value: str) -> str:
    """``value`` as a path component of ``kind``: a valid key, or one of the placeholders a layout
    function takes for a key (:data:`ANY_KEY`, :data:`KEY_PLACEHOLDER`, ``<shard>`` for people)."""
    if value in (ANY_KEY, KEY_PLACEHOLDER) or _DISPLAY_PLACEHOLDER.match(value or ""):
        return value
    return validate_key(kind, value)
