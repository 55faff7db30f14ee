"""The split's fast hash gives exactly ``stable_hash_column``'s values (the hash that defines the split)."""

import numpy as np
import polars as pl

from speechdata.asr.manifest import stable_hash_column
from speechdata.asr.split import SaltedMd5


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
