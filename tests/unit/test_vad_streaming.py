"""The VAD-chunked loader over real landed tars: chunks, skips, languages, workers; and build_urls."""

import io
import random

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.vad.chunks import chunk_capacity, chunk_rng, draw_chunk_starts
from speechdata.vad.language_index import build_language_shard_index, build_urls
from speechdata.vad.loader import (
    VadChunkDataset,
    collate_chunks,
    normalize_chunk,
    read_chunks,
    vad_chunk_loader,
)
from speechdata.vad.stage import run_vad_segments
from tests.conftest import land_shard

CHUNK_S, NUM_CHUNKS, RATE = 1.0, 3, 16_000
SHARDS = ("t0", "t1", "t2", "t3")

# name: (language, format, seconds, segments); every file's segments are landed ("imported")
FILES = {
    "en_long": ("en", "mp3", 4.0, [(0.2, 3.7)]),  # capacity 3 -> 3 chunks
    "fr_two": ("fr", "flac", 5.0, [(0.0, 1.4), (2.0, 4.9)]),  # capacity 1 + 2 -> 3 chunks
    "fr_many": ("fr", "wav", 9.0, [(0.5, 8.9)]),  # capacity 8 -> capped at 3
    "en_silent": ("en", "wav", 2.0, []),  # no_speech
    "en_short": ("en", "mp3", 2.0, [(0.1, 0.8), (1.0, 1.9)]),  # no_long_segment
    "es_talk": ("es", "flac", 3.0, [(0.0, 2.5)]),  # language_not_wanted for en/fr
}
EXPECTED_CHUNKS = {"en_long": 3, "fr_two": 3, "fr_many": 3}
SKIPS_PER_SHARD = ("no_speech", "no_long_segment", "language_not_wanted", "no_vad_data", "no_audio_member")
"""With languages en/fr, each shard skips one file for each reason (stray_*: no_vad_data, notes_*: no audio)."""


def noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * 0.1).astype(np.float32)


def encode(samples: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    container = {"mp3": "MP3", "flac": "FLAC", "wav": "WAV"}[fmt]
    sf.write(buffer, samples, RATE, format=container)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """Four landed tar shards, each with every kind of file, ingested and segmented (imported VAD)."""
    root = DataRoot(str(tmp_path_factory.mktemp("vad-stream") / "data"))
    for s, shard_id in enumerate(SHARDS):
        files, rows, segments = {}, [], []
        for f, (name, (language, fmt, seconds, spans)) in enumerate(FILES.items()):
            path = f"{name}_{shard_id}.{fmt}"
            files[path] = encode(noise(seconds, 10 * s + f), fmt)
            rows.append({"utt_id": f"{name}_{shard_id}", "audio_path": path, "language": language})
            segments.append({"audio_path": path, "start_s": [a for a, _ in spans], "end_s": [b for _, b in spans]})
        files[f"stray_{shard_id}.mp3"] = encode(noise(2.0, 99), "mp3")  # in the tar, not in the metadata
        files[f"notes_{shard_id}.json"] = b"{}"  # not audio
        land_shard(root, shard_id, rows, files, as_tar=True)
        root.write_parquet(layout.landing_vad_segments(shard_id), pa.Table.from_pylist(segments))
        run_raw_shards(root, shard_id)
        summary = run_vad_segments(root, shard_id, model=None)
        assert summary.imported_files == len(FILES) and not summary.rejects
    for language in ("en", "fr", "es"):
        root.write_parquet(
            layout.language_shard_index(language),
            build_language_shard_index(root, language, chunk_s=CHUNK_S, num_chunks=NUM_CHUNKS),
        )
    return root


def dataset(root, **options):
    urls = [root.uri(layout.landing_audio_tar(s)) for s in SHARDS]
    return VadChunkDataset(urls, root, chunk_s=CHUNK_S, num_chunks=NUM_CHUNKS, **options)


def test_chunks_lie_inside_one_segment_and_their_count_is_capped():
    rng = np.random.default_rng(0)
    for case in range(300):
        edges = np.sort(rng.uniform(0, 60, size=2 * rng.integers(0, 6)))
        starts, ends = list(edges[0::2]), list(edges[1::2])
        chunk_s, num_chunks = float(rng.choice([0.5, 2.0, 10.0])), int(rng.integers(1, 20))
        drawn = draw_chunk_starts(starts, ends, chunk_s, num_chunks, chunk_rng(1, 0, "t", str(case)))
        assert len(drawn) == min(num_chunks, chunk_capacity(starts, ends, chunk_s))
        for start in drawn:
            assert any(s <= start and start + chunk_s <= e + 1e-9 for s, e in zip(starts, ends))
        again = draw_chunk_starts(starts, ends, chunk_s, num_chunks, chunk_rng(1, 0, "t", str(case)))
        assert again == drawn


def test_every_file_yields_its_chunks_of_exact_length_inside_its_segments(streamed):
    samples = list(dataset(streamed, languages=["en", "fr"]))
    yielded = [s for s in samples if s["key"] is not None]
    assert {s["key"] for s in yielded} == {f"{n}_{t}" for n in EXPECTED_CHUNKS for t in SHARDS}
    for sample in yielded:
        name = sample["key"].rsplit("_", 1)[0]
        spans = FILES[name][3]
        assert sample["input_values"].shape == (EXPECTED_CHUNKS[name], int(CHUNK_S * RATE))
        for start in sample["chunk_start_s"]:
            assert any(a <= start and start + CHUNK_S <= b + 1e-9 for a, b in spans)
        values = sample["input_values"].numpy()
        assert np.allclose(values.mean(axis=1), 0, atol=1e-4) and np.allclose(values.std(axis=1), 1, atol=1e-3)


def test_each_skip_condition_is_counted_and_languages_are_filtered(streamed):
    data = dataset(streamed, languages=["en", "fr"])
    samples = list(data)
    expected = {reason: len(SHARDS) for reason in SKIPS_PER_SHARD}
    assert dict(data.skips) == expected
    assert collate_chunks(samples)["skipped"] == expected  # the counts also travel with the samples
    assert {s["language"] for s in samples if s["key"]} == {"en", "fr"}

    everything = list(dataset(streamed))
    assert {s["language"] for s in everything if s["key"]} == {"en", "fr", "es"}


def test_same_seed_same_chunks_and_a_new_epoch_draws_new_ones(streamed):
    first = {s["key"]: s for s in dataset(streamed, seed=7) if s["key"]}
    second = {s["key"]: s for s in dataset(streamed, seed=7) if s["key"]}
    assert first.keys() == second.keys()
    for key in first:
        assert first[key]["chunk_start_s"] == second[key]["chunk_start_s"]
        assert np.array_equal(first[key]["input_values"].numpy(), second[key]["input_values"].numpy())
    later = dataset(streamed, seed=7)
    later.set_epoch(1)
    moved = {s["key"]: s["chunk_start_s"] for s in later if s["key"]}
    assert any(moved[k] != first[k]["chunk_start_s"] for k in first)


def test_two_dataloader_workers_never_yield_the_same_file_twice(streamed):
    urls = build_urls(["en", "fr"], streamed)
    assert len(urls) == len(SHARDS)
    loader = vad_chunk_loader(
        urls,
        streamed,
        languages=["en", "fr"],
        chunk_s=CHUNK_S,
        num_chunks=NUM_CHUNKS,
        batch_size=2,
        num_workers=2,
    )
    files, chunks, skipped = [], 0, {}
    for batch in loader:
        assert batch["input_values"].shape[0] == len(batch["languages"]) == len(batch["keys"])
        files += sorted({(k, u) for k, u in zip(batch["keys"], batch["languages"])})
        chunks += batch["input_values"].shape[0]
        for reason, n in batch["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    keys = [key for key, _ in files]
    assert len(keys) == len(set(keys)) == len(EXPECTED_CHUNKS) * len(SHARDS)
    assert chunks == sum(EXPECTED_CHUNKS.values()) * len(SHARDS)
    assert skipped == {reason: len(SHARDS) for reason in SKIPS_PER_SHARD}  # exact across workers


def test_chunks_decode_only_their_frames_yet_match_the_whole_file():
    # 16 kHz speech at MP3's low bit rate needs the longest preroll after a seek (bit reservoir).
    from speechdata.audio.codec import resample
    from speechdata.testing.shards import load_clips

    speech = np.concatenate([resample(c.samples, c.sample_rate, RATE) for c in load_clips()])
    starts = sorted(np.random.default_rng(0).uniform(0, len(speech) / RATE - CHUNK_S, 40))
    for fmt in ("flac", "wav", "mp3"):
        data = encode(speech, fmt)
        whole, _ = sf.read(io.BytesIO(data), dtype="float32")
        chunks = read_chunks(data, starts, CHUNK_S, RATE)
        assert chunks.shape == (len(starts), RATE)
        for chunk, start in zip(chunks, starts):
            first = round(start * RATE)
            assert np.abs(chunk - whole[first : first + RATE]).max() < 1e-4, (fmt, start)


def test_normalization_is_the_feature_extractors():
    from transformers import Wav2Vec2FeatureExtractor

    chunk = noise(1.0, 5) * 3 + 0.2
    extractor = Wav2Vec2FeatureExtractor(do_normalize=True, sampling_rate=RATE)
    expected = extractor(chunk, sampling_rate=RATE)["input_values"][0]
    assert np.allclose(normalize_chunk(chunk), expected, atol=1e-5)


def test_a_corrupt_file_is_counted_as_a_decode_error(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    good = encode(noise(3.0, 1), "mp3")
    files = {"good.mp3": good, "bad.mp3": b"ID3" + bytes(random.Random(0).randbytes(4000))}
    from speechdata.io.audio_tars import write_deterministic_tar
    from speechdata.vad.stage import VAD_SEGMENTS_SCHEMA

    write_deterministic_tar(root, layout.landing_audio_tar("x"), sorted(files.items()))
    rows = [
        {
            "shard": "x",
            "audio_path": name,
            "tar_path": layout.landing_audio_tar("x"),
            "tar_key": name[:-4],
            "language": "en",
            "utt_ids": [name[:-4]],
            "duration_s": 3.0,
            "speech_s": 2.5,
            "n_segments": 1,
            "start_s": [0.0],
            "end_s": [2.5],
            "segments_source": "import",
        }
        for name in files
    ]
    root.write_parquet(layout.vad_segments("x"), pa.Table.from_pylist(rows, schema=VAD_SEGMENTS_SCHEMA))
    data = VadChunkDataset([root.uri(layout.landing_audio_tar("x"))], root, chunk_s=CHUNK_S, num_chunks=2)
    assert [s["key"] for s in data if s["key"]] == ["good"]
    assert dict(data.skips) == {"decode_error": 1}


def test_language_index_lists_each_shard_with_its_files_and_hours(streamed):
    index = build_language_shard_index(streamed, "fr", chunk_s=CHUNK_S, num_chunks=NUM_CHUNKS)
    assert index["shard"].to_pylist() == list(SHARDS)
    assert set(index["files"].to_pylist()) == {2}
    assert index["tar_keys"].to_pylist()[0] == ["fr_many_t0", "fr_two_t0"]
    assert index["hours"].to_pylist()[0] == pytest.approx((5.0 + 9.0) / 3600, rel=1e-3)
    assert index["usable_chunk_hours"].to_pylist()[0] == pytest.approx(6 * CHUNK_S / 3600)
    assert build_urls(["xx"], streamed) == []
    assert build_urls(["es"], streamed) == [streamed.uri(layout.landing_audio_tar(s)) for s in SHARDS]
