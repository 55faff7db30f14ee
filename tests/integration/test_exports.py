"""Every export read back by its trainer's own loader, from a data root that was copied and whose
original was deleted (so every stored reference must resolve against the copy)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.stage import build_and_write_asr_manifests
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.bridge.manifest import manifest_path
from speechdata.bridge.reader import bridge_dataset
from speechdata.export.lhotse import export_lhotse
from speechdata.export.moshi import MAIN_SPEAKER, export_moshi
from speechdata.export.nemo import PLAIN_MANIFEST, TARRED_MANIFEST, export_nemo
from speechdata.export.output import ExportError
from speechdata.export.selection import SampleFilter, select_published_samples
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.vad.language_index import build_language_shard_index, build_urls
from tests.integration.exported_root import build_finished_root
from tests.nemo_env import run_in_nemo_env

SHARDS = ("e1", "e2")


@pytest.fixture(scope="module")
def moved_root(tmp_path_factory, model_cache_dir):
    """A finished root (two shards, catalog refreshed) copied elsewhere, the original deleted."""
    from speechdata.catalog.cli import refresh

    base = tmp_path_factory.mktemp("relocation")
    original = DataRoot(str(base / "original"))
    build_finished_root(original, model_cache_dir, shards=((SHARDS[0], 1), (SHARDS[1], 2)))
    refresh(original)
    # The all-shard products too: ASR manifests and the language index, built where the root was.
    build_and_write_asr_manifests(original, AsrManifestConfig(validation_share=0.3, eval_per_language=1), combined=True)
    original.write_parquet(layout.language_shard_index("en"), build_language_shard_index(original, "en"))
    shutil.copytree(original.root, base / "moved")
    shutil.rmtree(original.root)
    return DataRoot(str(base / "moved"))


@pytest.fixture(scope="module")
def published(moved_root):
    """Each published sample as the bridge tars hold it, by (shard, key), read with webdataset."""
    rows = select_published_samples(moved_root).to_pylist()
    urls = sorted({moved_root.uri(row["tar_url"]) for row in rows})
    samples = {(s["json"]["shard"], s["__key__"]): s for s in bridge_dataset(urls)}
    assert len(samples) == len(rows) > 0
    return {(row["shard"], row["key"]): (row, samples[(row["shard"], row["key"])]) for row in rows}


def test_bridge_json_carries_the_word_alignment_and_the_catalog_words_view_matches(moved_root, published):
    from speechdata.catalog.cli import open_catalog

    for (shard, key), (_, sample) in published.items():
        words = sample["json"]["words"]
        assert words and all(set(w) == {"word", "start_ms", "end_ms"} for w in words)
        assert all(0 <= w["start_ms"] <= w["end_ms"] <= len(sample["wav"]) * 1000 // SAMPLE_RATE + 1 for w in words)
        assert [w["word"] for w in words] == sample["json"]["text"].split()
    # The catalog was refreshed on the original root: its views must read the copy.
    with open_catalog(moved_root) as connection:
        rows = connection.execute(
            "SELECT shard, key, word, start_ms, end_ms FROM words ORDER BY shard, key, word_index"
        ).fetchall()
        assert connection.execute("SELECT count(*) FROM samples").fetchone()[0] == len(published)
    expected = [
        (shard, key, w["word"], w["start_ms"], w["end_ms"])
        for (shard, key), (_, sample) in sorted(published.items())
        for w in sample["json"]["words"]
    ]
    assert rows == expected


def test_manifests_store_tar_references_relative_to_the_root(moved_root):
    for shard in SHARDS:
        urls = set(moved_root.read_parquet(manifest_path(shard))["tar_url"].to_pylist())
        [url] = urls
        assert url.startswith(f"bridge/{shard}-000000-") and url.endswith(".tar")


def test_asr_manifests_and_the_language_index_read_from_the_copy(moved_root):
    import polars as pl
    import webdataset as wds

    from speechdata.asr.dataset import AsrManifestDataset

    for split in ("train", "validation"):
        dataset = AsrManifestDataset(moved_root.path(layout.asr_manifest(split)), tokenizer=lambda text: [1, 2])
        assert len(dataset) > 0 and all(dataset[i] is not None for i in range(len(dataset)))
        lines = pl.read_ndjson(moved_root.path(layout.asr_manifest(split, "jsonl")))
        manifests_dir = os.path.dirname(moved_root.path(layout.asr_manifest(split, "jsonl")))
        # NeMo's rule: relative to the manifest's directory.
        assert all(os.path.isfile(os.path.join(manifests_dir, p)) for p in lines["audio_filepath"])
    urls = build_urls(["en"], moved_root)
    assert urls and all(url.startswith(moved_root.uri("")) for url in urls)
    assert sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False)) > 0


# --- NeMo -------------------------------------------------------------------------------------------
# NeMo's loaders run in the trainer's environment, .venv-nemo (tests/nemo_env.py): one NeMo process
# reads every NeMo export of this module, and the tests below assert on what it returned.


@pytest.fixture(scope="module")
def nemo_tarred(moved_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("nemo") / "tarred"
    result = export_nemo(moved_root, str(out), samples_per_tar=5, progress=False)
    return out, result


@pytest.fixture(scope="module")
def nemo_plain(moved_root, tmp_path_factory):
    """The plain export, moved after writing: the export is relocatable too."""
    work = tmp_path_factory.mktemp("nemo-plain")
    export_nemo(moved_root, str(work / "plain"), tarred=False, progress=False)
    os.replace(work / "plain", work / "elsewhere")
    return work / "elsewhere"


def _char_labels(published) -> list[str]:
    return sorted({c for row, _ in published.values() for c in (row["text"] or "").lower()})


def _published_by_member(published) -> dict[str, tuple[dict, dict]]:
    return {f"{shard}__{key}.wav": value for (shard, key), value in published.items()}


@pytest.fixture(scope="module")
def nemo_reads(nemo_tarred, nemo_plain, published, tmp_path_factory):
    """What NeMo's TarredAudioToChar/BPEDataset, LazyNeMoTarredIterator and AudioToCharDataset read."""
    from tests.integration.test_asr_nemo_smoke import tiny_sentencepiece

    out, result = nemo_tarred
    work = tmp_path_factory.mktemp("nemo-reads")
    texts = [row["text"] for row, _ in published.values()]
    request = {
        "tarred_dir": str(out),
        "tars": result.tars,
        "tarred_manifest": TARRED_MANIFEST,
        "plain_manifest": str(nemo_plain / PLAIN_MANIFEST),
        "labels": _char_labels(published),
        "sentencepiece_model": str(tiny_sentencepiece(work / "tokenizer", texts, []) / "tokenizer.model"),
        "lhotse_audio_npz": str(work / "lhotse_audio.npz"),
    }
    reads = run_in_nemo_env("read_exports.py", json.dumps(request))
    with np.load(request["lhotse_audio_npz"]) as audio:
        reads["lhotse_audio"] = {name: audio[name] for name in audio.files}
    return reads


@pytest.mark.slow
def test_nemo_tarred_char_dataset_reads_every_sample(nemo_tarred, nemo_reads, published):
    _, result = nemo_tarred
    assert result.tars == -(-len(published) // 5) and result.samples == len(published)
    by_member = _published_by_member(published)
    seen = []
    for entry in nemo_reads["tarred_char"]:
        row, sample = by_member[entry["member"]]
        seen.append(entry["member"])
        assert entry["text_raw"] == row["text"]
        assert abs(entry["duration"] - len(sample["wav"]) / SAMPLE_RATE) < 1e-6
        # NeMo resampled the 24 kHz WAV to 16 kHz: same length in time.
        assert abs(entry["audio_len"] / 16_000 - entry["duration"]) < 0.01
    assert sorted(seen) == sorted(by_member)


@pytest.mark.slow
def test_nemo_tarred_bpe_dataset_reads_every_sample(nemo_reads, published):
    bpe = nemo_reads["tarred_bpe"]
    assert bpe["items"] == bpe["length"] == len(published)
    assert sorted(bpe["decoded"]) == sorted(row["text"] for row, _ in published.values())


@pytest.mark.slow
def test_nemo_lhotse_tarred_iterator_reads_the_sharded_manifests(nemo_reads, published):
    by_member = _published_by_member(published)
    seen = []
    for cut in nemo_reads["lhotse_tarred"]:
        row, sample = by_member[cut["recording_id"]]
        seen.append(cut["recording_id"])
        assert cut["text"] == row["text"] and cut["language"] == row["language"]
        assert cut["sampling_rate"] == SAMPLE_RATE
        np.testing.assert_allclose(nemo_reads["lhotse_audio"][cut["recording_id"]], sample["wav"], atol=1e-4)
    assert sorted(seen) == sorted(by_member)


@pytest.mark.slow
def test_nemo_plain_manifest_resolves_relative_paths_with_audio_to_char_dataset(nemo_plain, nemo_reads, published):
    plain = nemo_reads["plain_char"]
    assert plain["length"] == len(published)
    lines = [json.loads(line) for line in (nemo_plain / PLAIN_MANIFEST).read_text().splitlines()]
    assert len(lines) == len(plain["audio_lens"])
    for line, audio_len in zip(lines, plain["audio_lens"], strict=True):
        assert not os.path.isabs(line["audio_filepath"])
        row, sample = published[(line["source_shard"], line["source_key"])]
        assert line["text"] == row["text"] and abs(line["duration"] - len(sample["wav"]) / SAMPLE_RATE) < 1e-6
        assert abs(audio_len / 16_000 - line["duration"]) < 0.01


# --- Lhotse -----------------------------------------------------------------------------------------


def test_lhotse_shar_reads_with_from_shar_and_loads_the_arrays(moved_root, published, tmp_path):
    from lhotse import CutSet

    result = export_lhotse(moved_root, str(tmp_path / "shar"), samples_per_shard=4, progress=False)
    assert result.shards == -(-len(published) // 4)
    cuts = CutSet.from_shar(in_dir=str(tmp_path / "shar" / "shar"))
    seen = []
    for cut in cuts:
        row, sample = published[(cut.custom["shard"], cut.custom["key"])]
        seen.append((cut.custom["shard"], cut.custom["key"]))
        [supervision] = cut.supervisions
        assert supervision.text == row["text"] and supervision.language == row["language"]
        assert abs(cut.duration - row["duration_s"]) < 1e-6
        np.testing.assert_allclose(cut.load_audio()[0], sample["wav"], atol=1e-4)
        for name in ("qwen", "wavlm", "tokens", "grid", "dur"):
            loaded = getattr(cut, f"load_{name}")()
            assert loaded.dtype == sample[name].dtype and loaded.shape == sample[name].shape, name
            np.testing.assert_array_equal(loaded, sample[name])
        assert len(cut.load_grid()) == -(-len(sample["wav"]) // 1920) and cut.custom["frame_rate_hz"] == 12.5
        words = [(a.symbol, round(a.start * 1000), round(a.end * 1000)) for a in supervision.alignment["word"]]
        assert words == [(w["word"], w["start_ms"], w["end_ms"]) for w in sample["json"]["words"]]
    assert sorted(seen) == sorted(published)


# --- moshi-finetune ---------------------------------------------------------------------------------


def moshi_finetune_parse(jsonl_path: str, duration_sec: float) -> list[tuple[str, float, list]]:
    """moshi-finetune's reading of a dataset, re-implemented from its code (kyutai-labs/moshi-finetune):

    ``finetune/data/dataset.py`` ``maybe_load_local_dataset``: each JSONL line's ``path`` is chunked
    every ``duration_sec`` from 0 while ``start_sec < data["duration"]``;
    ``finetune/data/interleaver.py`` ``InterleavedTokenizer.__call__``: the alignments are read from
    ``os.path.splitext(path)[0] + ".json"`` (opened as given, i.e. from the working directory),
    ``dicho`` bisects them on ``a[1][0]`` for the chunk and shifts them by ``start_sec``;
    ``Interleaver.prepare_item`` with ``keep_main_only=True`` (``train.py``) keeps the words of
    ``main_speaker_label="SPEAKER_MAIN"`` and ``_keep_those_with_duration`` those with start < end.
    """

    def dicho(alignment, val, i=0, j=None):
        if j is None:
            j = len(alignment)
        if i == j:
            return i
        k = (i + j) // 2
        if alignment[k][1][0] < val:
            return dicho(alignment, val, k + 1, j)
        return dicho(alignment, val, i, k)

    chunks = []
    with open(jsonl_path) as handle:
        for line in handle:
            data = json.loads(line)
            start_sec = 0
            while start_sec < data["duration"]:
                chunks.append((data["path"], start_sec))
                start_sec += duration_sec
    parsed = []
    for path, start_sec in chunks:
        with open(os.path.splitext(path)[0] + ".json") as f:
            alignments = json.load(f)["alignments"]
        lo, hi = dicho(alignments, start_sec), dicho(alignments, start_sec + duration_sec)
        window = [(a[0], (a[1][0] - start_sec, a[1][1] - start_sec), a[2]) for a in alignments[lo:hi]]
        window = sorted(window, key=lambda x: x[1][0])
        window = [a for a in window if a[2] == "SPEAKER_MAIN" and a[1][0] < a[1][1]]
        parsed.append((path, start_sec, window))
    return parsed


@contextlib.contextmanager
def working_directory(path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def test_moshi_layout_parses_as_moshi_finetune_parses_it(moved_root, published, tmp_path):
    out = tmp_path / "moshi"
    result = export_moshi(moved_root, str(out), progress=False)
    assert result.samples == len(published)
    with working_directory(out):
        parsed = moshi_finetune_parse("dataset.jsonl", duration_sec=100.0)  # one chunk per file
    assert len(parsed) == len(published)
    for path, start_sec, words in parsed:
        assert start_sec == 0 and not os.path.isabs(path)
        shard, key = path.split("/")[-2], path.split("/")[-1].removesuffix(".wav")
        row, sample = published[(shard, key)]
        stereo, rate = sf.read(out / path, dtype="float32", always_2d=True)
        assert rate == 24_000 and stereo.shape == (len(sample["wav"]), 2)
        np.testing.assert_allclose(stereo[:, 0], sample["wav"], atol=1e-4)  # the main speaker, left
        assert not stereo[:, 1].any()
        kept = [w for w in sample["json"]["words"] if w["start_ms"] < w["end_ms"]]
        assert [(w, round(s * 1000), round(e * 1000)) for w, (s, e), _ in words] == [
            (w["word"], w["start_ms"], w["end_ms"]) for w in kept
        ]
    with working_directory(out):
        chunked = moshi_finetune_parse("dataset.jsonl", duration_sec=2.0)
    assert {label for _, _, words in chunked for *_, label in words} == {MAIN_SPEAKER}
    assert len(chunked) == sum(-(-row["duration_s"] // 2.0) for row, _ in published.values())


# --- selection, atomic output, CLI ------------------------------------------------------------------


def test_filters_select_as_the_catalog_does(moved_root, published, tmp_path):
    english = [key for key, (row, _) in published.items() if row["language"] == "en"]
    assert 0 < len(english) < len(published)
    result = export_nemo(moved_root, str(tmp_path / "en"), SampleFilter(languages=("en",)), progress=False)
    assert result.samples == len(english)
    scores = sorted(row["alignment_score"] for row, _ in published.values())
    middle = scores[len(scores) // 2]
    kept = select_published_samples(moved_root, SampleFilter(min_alignment_score=middle))
    assert kept.num_rows == sum(score >= middle for score in scores)
    with pytest.raises(ExportError, match="no published sample"):
        export_nemo(moved_root, str(tmp_path / "none"), SampleFilter(languages=("xx",)), progress=False)
    assert not (tmp_path / "none").exists()
    with pytest.raises(ValueError, match="finite"):
        SampleFilter(min_alignment_score=float("nan"))


def test_a_failed_export_leaves_the_previous_one_and_foreign_directories_are_refused(moved_root, tmp_path):
    out = tmp_path / "out"
    export_moshi(moved_root, str(out), progress=False)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ExportError):
        export_moshi(moved_root, str(out), SampleFilter(languages=("xx",)), progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    with pytest.raises(ExportError, match="not an earlier export"):
        export_moshi(moved_root, str(foreign), progress=False)
    assert (foreign / "thesis.tex").read_text() == "mine"


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "speechdata.export", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_cli_exports_without_progress_into_a_pipe_and_explains_errors(moved_root, published, tmp_path):
    help_text = run_cli("nemo", "--help")
    assert help_text.returncode == 0 and "example:" in help_text.stdout and "--min-score" in help_text.stdout
    proc = run_cli("lhotse", "--data-root", moved_root.url, "--out", str(tmp_path / "shar"), "--language", "en")
    assert proc.returncode == 0, proc.stderr
    # stderr is a pipe here, not a terminal: no progress lines (docs/cli.md, "Conventions").
    assert "export lhotse:" not in proc.stderr and "wrote" in proc.stdout
    record = json.loads((tmp_path / "shar" / "export.json").read_text())
    assert record["selection"]["languages"] == ["en"] and record["samples"] > 0
    bad = run_cli("nemo", "--data-root", moved_root.url, "--out", str(tmp_path / "x"), "--min-score", "nan")
    assert bad.returncode == 2 and "must be finite" in bad.stderr
    empty = run_cli("moshi", "--data-root", moved_root.url, "--out", str(tmp_path / "y"), "--language", "xx")
    assert empty.returncode == 2 and "no published sample" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1


# --- the same root on a second bucket ---------------------------------------------------------------


def test_a_root_copied_to_a_bucket_reads_and_exports_the_same(moved_root, published, s3_endpoint, tmp_path):
    import s3fs

    from speechdata.catalog.cli import open_catalog

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("second-bucket")
    fs.put(moved_root.root, "second-bucket/copy", recursive=True)
    bucket = DataRoot("s3://second-bucket/copy")
    with open_catalog(bucket) as connection:
        assert connection.execute("SELECT count(*) FROM samples").fetchone()[0] == len(published)
        assert connection.execute("SELECT count(*) FROM words").fetchone()[0] == sum(
            len(sample["json"]["words"]) for _, sample in published.values()
        )
    local = export_nemo(moved_root, str(tmp_path / "local"), progress=False)
    remote = export_nemo(bucket, str(tmp_path / "remote"), progress=False)
    assert (local.samples, local.tars) == (remote.samples, remote.tars)
    assert (tmp_path / "local" / TARRED_MANIFEST).read_text() == (tmp_path / "remote" / TARRED_MANIFEST).read_text()
    for n in range(local.tars):
        assert (tmp_path / "local" / f"audio_{n}.tar").read_bytes() == (
            tmp_path / "remote" / f"audio_{n}.tar"
        ).read_bytes()
    moshi = export_moshi(bucket, str(tmp_path / "moshi"), progress=False)
    assert moshi.samples == len(published)
    shar = export_lhotse(bucket, str(tmp_path / "shar"), progress=False)
    with gzip.open(tmp_path / "shar" / "shar" / "cuts.000000.jsonl.gz", "rt") as handle:
        assert sum(1 for _ in handle) == shar.samples == len(published)
