"""Audio that carries no signal is a reject with its own reason; clipping is measured and, past the
limit, a reject. Each case is crafted audio landed through the real ingest."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from speechdata.audio.container import read_container_index
from speechdata.audio.truth import MAX_CLIPPED_SHARE
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone

RATE = 16_000


def clipped_tone(share: float, seconds: float = 1.0) -> np.ndarray:
    """A 440 Hz tone driven past full scale so that ``share`` of its samples sit at +-1."""
    # |A sin| >= 1 for a share 1 - (2 / pi) asin(1 / A) of the time
    amplitude = 1.0 / np.sin((1.0 - share) * np.pi / 2)
    return np.clip(tone(seconds, RATE) * 2 * amplitude, -1.0, 1.0)


def ingest(data_root, shard_id, files: dict[str, bytes], **options):
    rows = [{"utt_id": name.split(".")[0], "audio_path": name, "text": "hello there"} for name in files]
    land_shard(data_root, shard_id, rows, files)
    run_raw_shards(data_root, shard_id)
    summary = run_normalized_audio(data_root, shard_id, **options)
    rejects = {
        r["utt_id"]: (r["reason"], r["detail"])
        for r in data_root.read_parquet(layout.rejects(shard_id, "normalized_audio")).to_pylist()
    }
    packed = read_container_index(data_root, layout.normalized_audio(shard_id))
    return summary, rejects, dict(zip(packed["utt_id"].to_pylist(), packed["clipped_share"].to_pylist()))


def test_audio_without_signal_is_rejected_with_its_own_reason(data_root):
    speech = tone(1.0, RATE)
    nan = np.full(RATE, np.nan, np.float32)
    cancelled = np.stack([speech, -speech], axis=1)
    files = {
        "nan.wav": encode(nan, RATE, subtype="FLOAT"),
        "zero.wav": encode(np.zeros(RATE, np.float32), RATE),
        "cancelled.wav": encode(cancelled, RATE),
        "stereo.wav": encode(np.stack([speech, 0.5 * speech], axis=1), RATE),
        "speech.wav": encode(speech, RATE),
    }
    summary, rejects, packed = ingest(data_root, "nosignal", files)

    assert rejects["nan"][0] == "non_finite_audio"
    assert rejects["nan"][1] == f"nan.wav: {RATE} of {RATE} decoded samples are NaN or infinite"
    assert rejects["zero"][0] == "digital_silence" and rejects["zero"][1].startswith("zero.wav: every sample")
    assert rejects["cancelled"][0] == "cancelled_by_downmix"
    assert "the 2 channels cancel when mixed to mono" in rejects["cancelled"][1]
    assert set(packed) == {"stereo", "speech"}
    assert summary.rows_out + len(summary.rejects) == summary.rows_in == 5


def test_partly_nan_audio_is_rejected_not_quantized_to_noise(data_root):
    speech = tone(1.0, RATE)
    speech[100:110] = np.nan
    _, rejects, packed = ingest(data_root, "somenan", {"holes.wav": encode(speech, RATE, subtype="FLOAT")})
    assert rejects["holes"] == ("non_finite_audio", f"holes.wav: 10 of {RATE} decoded samples are NaN or infinite")
    assert packed == {}


def test_clipping_is_measured_and_heavy_clipping_rejected(data_root):
    files = {
        "clean.wav": encode(tone(1.0, RATE), RATE),
        "hot.wav": encode(clipped_tone(0.02), RATE),
        "crushed.wav": encode(clipped_tone(0.70), RATE),
    }
    summary, rejects, packed = ingest(data_root, "clipping", files)

    assert packed["clean"] == 0.0
    assert packed["hot"] == pytest.approx(0.02, abs=0.01)  # under the limit: packed, and flagged
    reason, detail = rejects["crushed"]
    assert reason == "audio_clipped"
    assert detail.startswith("crushed.wav: 70.") and f"(limit {MAX_CLIPPED_SHARE:.1%})" in detail
    assert "crushed" not in packed
    schema = pq.read_schema(data_root.path(layout.normalized_audio("clipping")))
    assert "clipped_share" in schema.names


def test_the_clipping_limit_is_configurable(data_root):
    files = {"hot.wav": encode(clipped_tone(0.02), RATE)}
    _, rejects, packed = ingest(data_root, "strict", files, max_clipped_share=0.01)
    assert rejects["hot"][0] == "audio_clipped" and "(limit 1.0%)" in rejects["hot"][1]
    assert packed == {}
