"""Audio that lies and inputs that crash without a name: each becomes a named reject or error."""

import io

import numpy as np
import pytest
import soundfile as sf

from speechdata.alignment.stage import run_alignments_from_import
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone


def truncated_mp3(seconds: float = 3.3, keep_share: float = 0.42, rate: int = 44_100) -> bytes:
    """An MP3 cut short whose Xing header still promises the full ``seconds``."""
    buffer = io.BytesIO()
    sf.write(buffer, tone(seconds, rate), rate, format="MP3")
    data = buffer.getvalue()
    return data[: int(len(data) * keep_share)]


def rejects_of(data_root, shard_id, stage):
    return {
        r["utt_id"]: (r["reason"], r["detail"])
        for r in data_root.read_parquet(layout.rejects(shard_id, stage)).to_pylist()
    }


def test_a_truncated_mp3_is_rejected_with_both_durations(data_root):
    cut = truncated_mp3()
    assert sf.info(io.BytesIO(cut)).duration == pytest.approx(3.3, abs=0.01)  # the header lies
    land_shard(
        data_root,
        "lies",
        [{"utt_id": "cut", "audio_path": "cut.mp3", "text": "hello"}, {"utt_id": "ok", "audio_path": "ok.wav"}],
        {"cut.mp3": cut, "ok.wav": encode(tone(1.0, 16_000), 16_000)},
    )
    run_raw_shards(data_root, "lies")
    run_normalized_audio(data_root, "lies")
    reason, detail = rejects_of(data_root, "lies", "normalized_audio")["cut"]
    assert reason == "audio_truncated"
    assert "cut.mp3: header promises 3.300 s for the segment, decoded 1." in detail


def test_an_implausible_sample_rate_is_rejected(data_root):
    slow = io.BytesIO()
    sf.write(slow, np.zeros(2000, np.float32), 1000, format="WAV")
    fast = io.BytesIO()
    sf.write(fast, np.zeros(400_000, np.float32), 400_000, format="WAV", subtype="FLOAT")
    land_shard(
        data_root,
        "rates",
        [{"utt_id": "slow", "audio_path": "slow.wav"}, {"utt_id": "fast", "audio_path": "fast.wav"}],
        {"slow.wav": slow.getvalue(), "fast.wav": fast.getvalue()},
    )
    run_raw_shards(data_root, "rates")
    rejects = rejects_of(data_root, "rates", "raw_shards")
    assert rejects["slow"] == (
        "implausible_sample_rate",
        "metadata row 0: slow.wav: header sample rate 1000 Hz is outside [4000, 384000] Hz",
    )
    assert rejects["fast"][0] == "implausible_sample_rate" and "400000 Hz" in rejects["fast"][1]


def test_a_punctuation_only_transcript_is_rejected_no_words(data_root):
    audio = encode(tone(1.0, 16_000), 16_000)
    land_shard(
        data_root,
        "punct",
        [
            {"utt_id": "p", "audio_path": "a.wav", "text": " ?!... — "},
            {"utt_id": "w", "audio_path": "a.wav", "text": "¿sí?"},
        ],
        {"a.wav": audio},
    )
    index = run_raw_shards(data_root, "punct").index
    reason, detail = rejects_of(data_root, "punct", "raw_shards")["p"]
    assert reason == "no_words" and "has no word character" in detail
    assert index["utt_id"].to_pylist() == ["w"]


def test_non_utf8_ctm_and_textgrid_are_rejects_naming_the_file_and_the_rule(data_root):
    audio = encode(tone(1.0, 16_000), 16_000)
    rows = [{"utt_id": u, "audio_path": "a.wav", "text": "cafe", "source": "import"} for u in ("c", "g")]
    land_shard(data_root, "latin", rows, {"a.wav": audio})
    directory = layout.landing_alignments_dir("latin")
    data_root.write_bytes(f"{directory}/c.ctm", "c 1 0.00 0.50 caf\xe9\n".encode("latin-1"))
    grid = 'File type = "ooTextFile"\nObject class = "TextGrid"\n"caf\xe9"\n'
    data_root.write_bytes(f"{directory}/g.TextGrid", grid.encode("latin-1"))
    run_raw_shards(data_root, "latin")
    run_normalized_audio(data_root, "latin")
    run_alignments_from_import(data_root, "latin")
    rejects = rejects_of(data_root, "latin", "alignments")
    for utt_id, name in (("c", "c.ctm"), ("g", "g.TextGrid")):
        reason, detail = rejects[utt_id]
        assert reason == "malformed_alignment_file"
        assert name in detail and "not utf-8" in detail.lower()


def test_reject_details_are_the_same_on_every_run(data_root):
    land_shard(
        data_root,
        "repeat",
        [{"utt_id": "bad", "audio_path": "bad.wav"}],
        {"bad.wav": b"RIFF\x00\x00\x00\x00WAVEjunk"},
    )
    run_raw_shards(data_root, "repeat")
    first = data_root.fs.cat_file(data_root.path(layout.rejects("repeat", "raw_shards")))
    run_raw_shards(data_root, "repeat")
    assert data_root.fs.cat_file(data_root.path(layout.rejects("repeat", "raw_shards"))) == first
    reason, detail = rejects_of(data_root, "repeat", "raw_shards")["bad"]
    assert reason == "audio_unreadable" and " at 0x" not in detail
