"""The vad assets materialized in process with the real Silero model: an imported language-ID tar and a
sample shard landed as a directory, then the language index and the loader over what they wrote."""

import io
import tarfile

import dagster as dg
import numpy as np
import pytest
import soundfile as sf

from assets.ingest import raw_shards
from assets.partitions import language_partitions
from assets.vad import language_shard_index, vad_segments
from speechdata.audio.codec import resample
from speechdata.importers.language_tars import import_language_tar
from speechdata.io import layout
from speechdata.testing.shards import build_sample_shard
from speechdata.vad.language_index import build_urls
from speechdata.vad.loader import vad_chunk_loader
from tests.materialize import materialize_shard
from tests.tiny_resources import tiny_resources_for

CHUNK_CONFIG = {"chunk_s": 1.0, "num_chunks": 4}


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def materialization(result, key):
    [event] = result.asset_materializations_for_node(key)
    return event.metadata


def seed_layout_tar(path, clips) -> dict:
    """A tar in the language-ID layout: one mp3 per clip with silence around it; returns lid_index entries for all but one."""
    index = {}
    with tarfile.open(path, "w") as tar:
        for i, clip in enumerate(clips):
            speech = resample(clip.samples, clip.sample_rate, 16_000)
            audio = np.concatenate([np.zeros(8_000, np.float32), speech, np.zeros(16_000, np.float32)])
            buffer = io.BytesIO()
            sf.write(buffer, audio, 16_000, format="MP3")
            info = tarfile.TarInfo(f"{clip.utt_id}.mp3")
            info.size = len(buffer.getvalue())
            tar.addfile(info, io.BytesIO(buffer.getvalue()))
            if i:
                index[(5, clip.utt_id)] = clip.language
    return index


def test_imported_and_sample_shards_are_segmented_indexed_and_streamed(instance, data_root, clips, tmp_path):
    first_of = {}
    for clip in clips:
        first_of.setdefault(clip.language, clip)
    clips = [first_of[language] for language in ("es", "en", "fr", "de")]  # es: unknown to the index
    index = seed_layout_tar(tmp_path / "000005.tar", clips)
    cached = {clips[1].utt_id: {"segments": [(0.5, 2.0)]}}
    imported = import_language_tar(
        data_root, str(tmp_path / "000005.tar"), index, vad_cache=lambda n: cached if n == 5 else None
    )
    assert (imported.shard_id, imported.files, imported.unknown_language, imported.vad_files) == ("lid-000005", 4, 1, 1)
    build_sample_shard(data_root, "dir1", 8, seed=3, as_tar=False)

    resources = tiny_resources_for(data_root.url)
    run_config = {"ops": {"vad_segments": {"config": CHUNK_CONFIG}}}
    metadata = {}
    for shard_id in ("lid-000005", "dir1"):
        result = materialize_shard(
            instance, data_root, shard_id, [raw_shards, vad_segments], resources=resources, run_config=run_config
        )
        assert result.success
        assert all(check.passed for check in result.get_asset_check_evaluations())
        metadata[shard_id] = materialization(result, "vad_segments")

    lid = metadata["lid-000005"]
    assert lid["dagster/row_count"].value == 4
    assert lid["imported_files"].value == 1
    assert 0.2 < lid["speech_share"].value < 0.95  # the inserted silence is not speech
    assert lid["rejects"].value == 0
    table = data_root.read_parquet(layout.vad_segments("lid-000005")).to_pylist()
    by_key = {row["tar_key"]: row for row in table}
    assert by_key[clips[1].utt_id]["segments_source"] == "import"
    assert (by_key[clips[1].utt_id]["start_s"], by_key[clips[1].utt_id]["end_s"]) == ([0.5], [2.0])
    for row in table:
        if row["segments_source"] == "silero":
            assert row["n_segments"] >= 1 and row["start_s"][0] >= 0.5 - 0.25  # 0.5 s of silence first
    assert by_key[clips[0].utt_id]["language"] is None

    sample = metadata["dir1"]
    assert sample["files_not_streamable"].value == 0
    assert set(sample["usable_chunk_hours_by_language"].value) == {"de", "en", "es", "fr"}
    [packed] = set(data_root.read_parquet(layout.vad_segments("dir1"))["tar_path"].to_pylist())
    assert layout.is_packed_audio_tar_name(packed.rsplit("/", 1)[-1]) and data_root.exists(packed)  # a tar to stream
    assert "| audio_path |" in sample["preview"].value

    instance.add_dynamic_partitions(language_partitions.name, ["en", "fr"])
    for language in ("en", "fr"):
        result = dg.materialize(
            [language_shard_index],
            partition_key=language,
            instance=instance,
            resources=resources,
            run_config={"ops": {"language_shard_index": {"config": CHUNK_CONFIG}}},
        )
        assert result.success
        meta = materialization(result, "language_shard_index")
        assert meta["dagster/row_count"].value == 2  # both shards hold en and fr
        assert meta["usable_chunk_hours"].value > 0

    urls = build_urls(["en"], data_root)
    assert urls == [
        data_root.uri(layout.landing_audio_tar("lid-000005")),
        data_root.uri(packed),
    ]
    loader = vad_chunk_loader(urls, data_root, languages=["en"], chunk_s=1.0, num_chunks=4, batch_size=4)
    batches = list(loader)
    languages = [language for batch in batches for language in batch["languages"]]
    assert languages and set(languages) == {"en"}
    skipped = {}
    for batch in batches:
        for reason, n in batch["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    assert skipped.get("language_not_wanted", 0) >= 6
