"""The demo's sample corpus is distinct speech: each clip lands once, and only the plants repeat or break."""

import json
from collections import Counter

import pytest
import soundfile as sf

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.demo_corpus import DEMO_SPEECH_DIR, land_demo_corpus


def test_the_committed_clips_are_16_khz_mono_distinct_and_fit_for_an_aligner():
    manifest = json.loads((DEMO_SPEECH_DIR / "manifest.json").read_text())
    assert {e["language"] for e in manifest} >= {"en", "de", "fr"}
    assert len({e["voice"] for e in manifest}) >= 6 and len({e["speed"] for e in manifest}) >= 3
    assert len({e["text"] for e in manifest}) == len(manifest)
    for entry in manifest:
        info = sf.info(DEMO_SPEECH_DIR / entry["file"])
        assert (info.samplerate, info.channels) == (16_000, 1), entry["file"]
        assert abs(info.duration - entry["duration_s"]) < 0.01
        # Transcripts an aligner can match exactly: lower-case letters and single spaces, no digits.
        assert entry["text"] == entry["text"].lower().strip() and "  " not in entry["text"]
        assert not any(c.isdigit() or c in ".,;:!?'\"" for c in entry["text"]), entry["text"]
        if not entry["short"]:
            assert 3.0 <= entry["duration_s"] <= 8.0, entry
    total = sum((DEMO_SPEECH_DIR / e["file"]).stat().st_size for e in manifest)
    assert total < 5_000_000


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    base = tmp_path_factory.mktemp("demo-corpus")
    root = DataRoot(str(base / "data"))
    return root, land_demo_corpus(root, str(base / "sources"))


def test_every_landing_form_lands_and_every_clip_is_spoken_once_but_the_planted_copy(landed):
    root, corpus = landed
    assert {"demo-0001", "demo-0002", "granary-en-000001", "segments-en-000001", "lid-000001"} <= set(corpus.shards)
    assert sum(s.startswith(("de-", "fr-")) for s in corpus.shards) == 2
    assert root.exists(layout.landing_audio_tar("demo-0002")) and not root.exists(layout.landing_audio_tar("demo-0001"))
    texts = Counter()
    for shard_id in corpus.shards:
        assert root.exists(layout.landing_success_marker(shard_id)), shard_id
        table = root.read_parquet(layout.landing_metadata(shard_id), columns=["utt_id", "text"])
        planted = {p.utt_id for p in corpus.planted if p.shard == shard_id}
        texts.update(
            t
            for u, t in zip(table["utt_id"].to_pylist(), table["text"].to_pylist(), strict=True)
            if t and u not in planted
        )
    assert texts and texts.most_common(1)[0][1] == 1
    assert len(texts) >= 45


def test_each_plant_names_a_landed_utterance_and_the_copy_names_its_original(landed):
    root, corpus = landed
    reasons = Counter(p.reason for p in corpus.planted)
    assert reasons["near_duplicate"] == 1 and reasons["too_short"] == 4 and reasons["audio_unreadable"] == 1
    for plant in corpus.planted:
        ids = root.read_parquet(layout.landing_metadata(plant.shard), columns=["utt_id"])["utt_id"].to_pylist()
        assert plant.utt_id in ids, plant
    [copy] = [p for p in corpus.planted if p.reason == "near_duplicate"]
    original_id = copy.detail.split()[1].removesuffix(":").split("/")[1]
    original = root.read_parquet(layout.landing_metadata("demo-0001")).to_pylist()
    copied = root.read_parquet(layout.landing_metadata(copy.shard)).to_pylist()
    [original_text] = [r["text"] for r in original if r["utt_id"] == original_id]
    [copy_text] = [r["text"] for r in copied if r["utt_id"] == copy.utt_id]
    assert copy_text == original_text
