"""Train, validation and eval by recording (steps 5-6 of :mod:`speechdata.asr.manifest`).

A recording goes to validation when the salted MD5 of its key falls under the validation share,
so a recording's split never changes when shards are added; the eval subset is each language's
validation utterances with the smallest MD5 of their key.

The hash is :func:`speechdata.asr.manifest.stable_hash_column`'s (DuckDB's
``md5_number_lower(salt || key)``: the low 64 bits of the MD5, read little-endian), computed by
:class:`SaltedMd5` on one DuckDB connection per build and from DuckDB's hex ``md5``: its
characters 16-31 are bytes 8-15, whose little-endian ``u64`` is the value. ``md5_number_lower``
costs several ``md5`` calls on short keys, and opening a connection costs as much as hashing many
thousands of keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

UTTERANCE_KEY = pl.col("shard_id") + pl.lit("/") + pl.col("utt_id")
"""An utterance's key in the split hash and in duplicates' ``detail``: ``<shard_id>/<utt_id>``."""

MIN_RECORDINGS_FOR_HELD_OUT = 3
"""With this many recordings, validation (and so eval) always holds at least one (the HF split rule)."""

HASH_BUCKETS = 1_000_000
"""A recording is in validation when its hash modulo this is under ``validation_share`` of it."""


class SaltedMd5:
    """``md5_number_lower(salt || key)`` per key, on one DuckDB connection (close it, or use ``with``).

    The connection opens on the first call, in the thread that makes it: a process's first DuckDB
    connection and query cost more than hashing 100 000 keys, and the build makes its first call in
    a background thread.
    """

    def __init__(self, salt: str) -> None:
        self.salt = salt
        self._connection: duckdb.DuckDBPyConnection | None = None

    def __enter__(self) -> SaltedMd5:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __call__(self, keys: pl.Series) -> pl.Series:
        """The hash of each key as ``UInt64`` (null for a null key), named ``<keys>_hash``."""
        # The salt is joined in polars, so no value from the data or the config is ever SQL text.
        salted = keys.cast(pl.String).to_frame("k").select((pl.lit(self.salt, pl.String) + pl.col("k")).alias("k"))
        if self._connection is None:
            self._connection = duckdb.connect()
        self._connection.register("salted_keys", salted.to_arrow())
        try:
            digests = self._connection.sql("SELECT md5(k) AS h FROM salted_keys").to_arrow_table()
        finally:
            self._connection.unregister("salted_keys")
        low_bytes = pl.from_arrow(digests)["h"].str.slice(16, 16).str.decode("hex")
        return low_bytes.bin.reinterpret(dtype=pl.UInt64, endianness="little").alias(f"{keys.name}_hash")


@dataclass(frozen=True)
class RecordingSplit:
    train: pl.DataFrame
    validation: pl.DataFrame
    eval: pl.DataFrame
    recordings: int
    """Recordings among the kept utterances."""
    forced_validation: str | None
    """The recording moved into validation because the hash rule gave it none."""


def recording_buckets(recording_keys: pl.Series, salted_md5: SaltedMd5) -> pl.DataFrame:
    """Each recording once (``recording_key``) and its hash bucket (``bucket``, below :data:`HASH_BUCKETS`)."""
    recordings = recording_keys.unique().to_frame("recording_key")
    return recordings.with_columns((salted_md5(recordings["recording_key"]) % HASH_BUCKETS).alias("bucket"))


def split_by_recording(
    kept: pl.DataFrame,
    buckets: pl.DataFrame,
    salted_md5: SaltedMd5,
    *,
    validation_share: float,
    eval_per_language: int,
) -> RecordingSplit:
    """``kept`` (manifest rows in key order, with ``recording_key``) split by recording.

    ``buckets`` is :func:`recording_buckets` of any set of recordings that holds ``kept``'s (so it
    can be hashed before the last rows are removed). With :data:`MIN_RECORDINGS_FOR_HELD_OUT` or
    more recordings, a non-zero share and none under it, the recording with the smallest bucket
    goes to validation. The outputs keep ``kept``'s columns but ``recording_key``, rows in
    ``kept``'s order (eval: by language, then hash of the utterance key).
    """
    recordings = buckets.filter(pl.col("recording_key").is_in(kept["recording_key"].implode()))
    held_out = recordings["bucket"] < int(validation_share * HASH_BUCKETS)
    forced = None
    # A share of 0 asks for no validation; any other share gets at least one recording.
    if validation_share > 0 and recordings.height >= MIN_RECORDINGS_FOR_HELD_OUT and not held_out.any():
        # The recording the threshold would take next: the smallest hash bucket.
        forced = recordings.sort("bucket", "recording_key")["recording_key"][0]
        held_out = recordings["recording_key"] == forced
    # Membership in the (few) validation recordings rather than a join of every row to its recording.
    is_validation = kept["recording_key"].is_in(recordings["recording_key"].filter(held_out).implode())
    manifest = kept.drop("recording_key")
    validation = manifest.filter(is_validation)
    key = validation.select(UTTERANCE_KEY.alias("key"))["key"]
    eval_subset = (
        validation.with_columns(key, salted_md5(key))
        .sort("lang", "key_hash", "key")
        .group_by("lang", maintain_order=True)
        .head(eval_per_language)
        .select(manifest.columns)
    )
    return RecordingSplit(
        train=manifest.filter(~is_validation),
        validation=validation,
        eval=eval_subset,
        recordings=recordings.height,
        forced_validation=forced,
    )
