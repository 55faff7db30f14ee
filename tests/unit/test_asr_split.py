"""The split by recording: its fast hash gives exactly ``stable_hash_column``'s values (the hash
that defines the split), and hashing more recordings than are kept changes nothing."""

import numpy as np
import polars as pl
import pytest

from speechdata.asr.manifest import stable_hash_column
from speechdata.asr.split import SaltedMd5, recording_buckets, split_by_recording


def test_salted_md5_equals_stable_hash_column_on_keys_of_any_characters():
    rng = np.random.default_rng(0)
    alphabet = list("ab/:_- \u00e9\u0905\u093c\u0b95\u4e2d\U0001f600\x00\x01")
    random_keys = ["".join(rng.choice(alphabet, rng.integers(0, 40))) for _ in range(2_000)]
    keys = pl.Series("key", ["", None, "shard:x", "s/u", *random_keys], dtype=pl.String)
    for salt in ("asr-split-v1", "", "it's \u00e9 salt"):
        with SaltedMd5(salt) as salted_md5:
            fast = salted_md5(keys)
            assert fast.dtype == pl.UInt64 and fast.name == "key_hash"
            assert salted_md5(keys.head(0)).len() == 0
        expected = stable_hash_column(keys.to_frame(), "key", salt)
        assert fast.null_count() == 1
        assert fast.equals(expected)


def test_salt_changes_every_hash():
    keys = pl.Series("key", [f"rec{i}" for i in range(100)])
    with SaltedMd5("a") as a, SaltedMd5("b") as b:
        assert (a(keys) != b(keys)).all()


def _kept(n_recordings: int) -> pl.DataFrame:
    rows = [(f"s{r % 2}", f"u{r}_{k}", f"rec{r}", ["hi", "en"][r % 2]) for r in range(n_recordings) for k in range(3)]
    return pl.DataFrame(rows, schema=["shard_id", "utt_id", "recording_key", "lang"], orient="row")


def _split(kept: pl.DataFrame, recording_keys: pl.Series, share: float):
    with SaltedMd5("asr-split-v1") as salted_md5:
        buckets = recording_buckets(recording_keys, salted_md5)
        return split_by_recording(kept, buckets, salted_md5, validation_share=share, eval_per_language=2)


@pytest.mark.parametrize("share", [0.0, 0.001, 0.3])
def test_hashing_more_recordings_than_are_kept_changes_nothing(share):
    # The build hashes the recordings of every row before deduplication (in the background), a
    # superset of the kept rows' recordings; a recording with no kept row must not count.
    kept = _kept(40)
    exact = _split(kept, kept["recording_key"], share)
    extra = pl.Series("recording_key", [f"gone{i}" for i in range(500)])
    superset = _split(kept, pl.concat([kept["recording_key"], extra]), share)
    assert (
        (superset.recordings, superset.forced_validation)
        == (exact.recordings, exact.forced_validation)
        == (
            40,
            superset.forced_validation,
        )
    )
    for name in ("train", "validation", "eval"):
        assert getattr(superset, name).equals(getattr(exact, name))
    assert superset.train.height + superset.validation.height == kept.height
    assert (superset.validation.height > 0) == (share > 0)
    assert "recording_key" not in superset.train.columns
