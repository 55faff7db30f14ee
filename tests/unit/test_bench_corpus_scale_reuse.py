"""The corpus-scale benchmark keeps the shards it cloned, so a 10 000-hour corpus (minutes to hours of
cloning) can be measured again with ``--reuse-corpus``: only finished clones count, and a shard a
killed run left half written is cloned again over what it wrote."""

from __future__ import annotations

import os

from benchmarks.corpus.bench_corpus_scale import TEMPLATE_SHARD, clone_shards, cloned_ledger, cloned_shards


def _template(folder):
    shard = folder / "template" / "shards" / TEMPLATE_SHARD
    shard.mkdir(parents=True)
    (shard / "manifest.json").write_text(f'{{"shard_id": "{TEMPLATE_SHARD}"}}')
    (shard / "audio_24k.parquet").write_bytes(b"payload")
    files = [f"shards/{TEMPLATE_SHARD}/audio_24k.parquet", f"shards/{TEMPLATE_SHARD}/manifest.json"]
    return folder / "template", files


def test_cloned_shards_lists_finished_clones_with_renamed_tables_and_linked_payloads(tmp_path):
    template, files = _template(tmp_path)
    root = tmp_path / "corpus"
    clone_shards(template, files, root, ["shard-000001", "shard-000000"], workers=1)

    assert cloned_shards(root) == ["shard-000000", "shard-000001"]
    assert (root / "shards/shard-000001/manifest.json").read_text() == '{"shard_id": "shard-000001"}'
    payload = os.stat(root / "shards/shard-000001/audio_24k.parquet")
    assert payload.st_ino == os.stat(template / files[0]).st_ino
    assert not cloned_ledger(root).is_relative_to(root), "no stage may list the ledger as corpus data"


def test_a_half_cloned_shard_is_not_listed_and_clones_again(tmp_path):
    template, files = _template(tmp_path)
    root = tmp_path / "corpus"
    half = root / "shards/shard-000000"
    half.mkdir(parents=True)
    os.link(template / files[0], half / "audio_24k.parquet")

    assert cloned_shards(root) == []
    clone_shards(template, files, root, ["shard-000000"], workers=1)
    assert cloned_shards(root) == ["shard-000000"]
    assert (half / "manifest.json").exists()
