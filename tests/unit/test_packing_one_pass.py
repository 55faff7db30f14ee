"""The one-pass packing reader gives the same samples, hence the same tar bytes, as whole-file reads."""

import hashlib

import numpy as np
import pytest

from speechdata.audio.codec import decode_audio, decode_pcm16
from speechdata.bridge.tars import BridgeSample, iter_bridge_samples, pack_samples, word_alignments
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.io.keyed_stream import KeyedRows, reorder_buffer_rows
from speechdata.io.storage import DataRoot
from speechdata.testing.packing_inputs import write_packing_inputs


def reference_samples(root: DataRoot, shard_id: str) -> list[BridgeSample]:
    """Every input read whole into memory, joined by key: the obvious (quadratic-free, memory-hungry) way."""
    grids = {r["utt_id"]: r for r in root.read_parquet(layout.frame_grids(shard_id)).to_pylist()}
    info = {r["utt_id"]: r for r in root.read_parquet(layout.utterance_index(shard_id)).to_pylist()}
    container = root.read_parquet(layout.normalized_audio(shard_id), columns=["utt_id", "codec", "audio"])
    audio = {r["utt_id"]: decode_pcm16(r["audio"], r["codec"]) for r in container.to_pylist()}
    qwen = dict(iter_arrays(root, layout.qwen_hidden_states(shard_id)))
    wavlm = dict(iter_arrays(root, layout.wavlm_features(shard_id)))
    words = word_alignments(root, shard_id)
    samples = []
    for key in sorted(set(grids) & set(qwen) & set(wavlm)):
        grid, meta = grids[key], info[key]
        samples.append(
            BridgeSample(
                key=key,
                wav=audio[key],
                qwen=qwen[key],
                wavlm=wavlm[key],
                tokens=np.asarray(grid["tokens"]),
                grid=np.asarray(grid["grid"]),
                dur=np.asarray(grid["dur"]),
                info={
                    "text": meta["text"],
                    "text_source": "landed",
                    "language": meta["language"],
                    "country": meta["country"],
                    "source": meta["source"],
                    "shard": shard_id,
                    "sample_rate": 24_000,
                    "frame_rate": 12.5,
                    "n_frames": grid["n_frames"],
                    "n_tokens": grid["n_tokens"],
                    "words": words[key],
                },
            )
        )
    return samples


def tar_digests(root: DataRoot, shard_id: str, samples) -> list[str]:
    tars, index = pack_samples(root, shard_id, iter(samples), max_tar_bytes=2_000_000)
    return [hashlib.sha256(open(root.path(t.relative), "rb").read()).hexdigest() for t in tars] + [
        str(index.to_pylist())
    ]


@pytest.mark.parametrize("audio_order", ["sorted", "blocks", "shuffled"])
def test_one_pass_tars_are_byte_identical_to_whole_file_reads(tmp_path, audio_order):
    root = DataRoot(str(tmp_path))
    keys = write_packing_inputs(root, "s1", 120, seconds=1.0, qwen_dim=16, wavlm_dim=8, audio_order=audio_order)
    # Drop some keys from one feature store: only utterances present everywhere are packed.
    kept = [k for n, k in enumerate(keys) if n % 7]
    from speechdata.features.array_store import write_arrays

    qwen = dict(iter_arrays(root, layout.qwen_hidden_states("s1")))
    write_arrays(root, layout.qwen_hidden_states("s1"), ((k, qwen[k]) for k in kept))

    expected = tar_digests(root, "s1", reference_samples(root, "s1"))
    actual = tar_digests(root, "s1", iter_bridge_samples(root, "s1"))
    assert actual == expected
    assert len(expected) > 2  # several tars, so rollover is covered too


def test_random_access_fallback_matches_streaming(tmp_path):
    root = DataRoot(str(tmp_path))
    keys = write_packing_inputs(root, "s1", 300, seconds=0.5, qwen_dim=8, wavlm_dim=8, audio_order="shuffled")
    wanted = sorted(keys)[::3]
    relative = layout.normalized_audio("s1")
    streamed = KeyedRows(root, relative, ["audio"], wanted)
    forced = KeyedRows(root, relative, ["audio"], wanted, max_buffer_bytes=0)
    assert streamed.streamed and not forced.streamed
    assert [r["utt_id"] for r in streamed] == wanted
    assert list(streamed) == list(forced)


def test_reorder_buffer_rows():
    assert reorder_buffer_rows(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert reorder_buffer_rows(["c", "b", "a"], ["a", "b", "c"]) == 2
    assert reorder_buffer_rows(["b", "a", "d", "c"], ["a", "b", "c", "d"]) == 1
    assert reorder_buffer_rows(["x", "c", "a", "b"], ["a", "b"]) == 0  # rows not wanted never wait


def test_missing_key_names_the_file(tmp_path):
    root = DataRoot(str(tmp_path))
    write_packing_inputs(root, "s1", 5, seconds=0.5, qwen_dim=8, wavlm_dim=8)
    with pytest.raises(KeyError, match="qwen.*nope"):
        KeyedRows(root, layout.qwen_hidden_states("s1"), ["data"], ["nope"])


@pytest.mark.parametrize("n_samples", [0, 1, 7, 24_000])
def test_wav_member_is_what_soundfile_writes(n_samples):
    import io

    import soundfile as sf

    from speechdata.bridge.tar_members import wav_bytes

    samples = np.random.default_rng(n_samples).uniform(-1.2, 1.2, n_samples).astype(np.float32)
    buffer = io.BytesIO()
    pcm = np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
    sf.write(buffer, pcm, 24_000, format="WAV", subtype="PCM_16")
    assert wav_bytes(samples) == buffer.getvalue()
    decoded, rate = sf.read(io.BytesIO(wav_bytes(samples)), dtype="int16")
    assert rate == 24_000 and np.array_equal(decoded, pcm)


def test_wav_members_carry_the_stored_integers_whichever_16_bit_codec_stored_them(tmp_path):
    """Loud audio (past half scale, where dividing by 32767 or 32768 rounds differently): flac16 and
    pcm16 containers pack to the same tars, and each WAV member holds exactly the stored samples,
    which soundfile reads back as the floats the feature stages were given."""
    import io
    import tarfile

    import soundfile as sf

    digests = {}
    for codec in ("flac16", "pcm16"):
        root = DataRoot(str(tmp_path / codec))
        write_packing_inputs(root, "s1", 12, seconds=0.5, qwen_dim=8, wavlm_dim=8, codec=codec, amplitude=0.9)
        digests[codec] = tar_digests(root, "s1", iter_bridge_samples(root, "s1"))
        stored = root.read_parquet(layout.normalized_audio("s1")).to_pylist()
        assert {r["codec"] for r in stored} == {codec}
        [tar_path] = root.fs.glob(root.path("shards/s1/bridge_staged/*.tar"))
        with tarfile.open(tar_path) as tar:
            wavs = {m.name[: -len(".wav")]: tar.extractfile(m).read() for m in tar if m.name.endswith(".wav")}
        assert len(wavs) == len(stored)
        for row in stored:
            ints = decode_pcm16(row["audio"], codec)
            assert (np.abs(ints.astype(np.int32)) > 16384).any()
            read_ints, rate = sf.read(io.BytesIO(wavs[row["utt_id"]]), dtype="int16")
            assert rate == 24_000 and np.array_equal(read_ints, ints)
            read_floats, _ = sf.read(io.BytesIO(wavs[row["utt_id"]]), dtype="float32")
            assert np.array_equal(read_floats, decode_audio(row["audio"], codec))
    assert digests["flac16"] == digests["pcm16"]


def test_words_in_key_order_match_the_whole_shard_dict(tmp_path):
    from speechdata.alignment.table import TimedUnit, alignment_rows, alignments_table
    from speechdata.bridge.tars import words_in_key_order

    root = DataRoot(str(tmp_path))
    rows = []
    for key, words in (("b", ["x", "y", "z"]), ("d", ["w"]), ("a", ["p", "q"])):
        units = [TimedUnit(w, 10 * i, 10 * i + 5, 0.0) for i, w in enumerate(words)]
        rows += alignment_rows(key, "word", list(reversed(units)))  # out of order on disk
        rows += alignment_rows(key, "token", units)  # other levels are left out
    root.write_parquet(layout.alignments("s"), alignments_table(rows))
    keys = ["a", "b", "c", "d", "e"]
    by_key = word_alignments(root, "s")
    assert list(words_in_key_order(root, "s", keys)) == [by_key.get(k, []) for k in keys]
    assert [len(w) for w in words_in_key_order(root, "s", keys)] == [2, 3, 0, 1, 0]
    root.write_parquet(layout.alignments("s"), alignments_table([]))
    assert list(words_in_key_order(root, "s", keys)) == [[]] * 5


def test_read_ahead_keeps_order_raises_the_readers_error_and_stops_when_the_caller_does():
    import threading

    from speechdata.io.keyed_stream import read_ahead

    assert list(read_ahead(iter(range(100)), depth=3)) == list(range(100))

    def failing():
        yield 1
        raise KeyError("missing row")

    rows = read_ahead(failing(), depth=2)
    assert next(rows) == 1
    with pytest.raises(KeyError, match="missing row"):
        next(rows)

    produced = []

    def endless():
        n = 0
        while True:
            produced.append(n)
            yield n
            n += 1

    before = threading.active_count()
    rows = read_ahead(endless(), depth=4)
    assert [next(rows) for _ in range(5)] == [0, 1, 2, 3, 4]
    rows.close()  # the caller stops: the thread must stop too, at most depth rows later
    assert threading.active_count() == before
    assert len(produced) <= 5 + 4 + 2


def test_read_ahead_stops_when_the_caller_stops_with_the_queue_full_at_the_end():
    import time

    from speechdata.io.keyed_stream import read_ahead

    rows = read_ahead(iter(range(3)), depth=1)
    assert next(rows) == 0
    time.sleep(0.3)  # the reader is done and waits to hand over its end marker
    rows.close()  # must not hang
