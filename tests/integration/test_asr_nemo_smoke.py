"""A sampler batch from the real manifest feeds a tiny NeMo transducer's forward and loss on the CPU.

NeMo runs in the trainer's environment, ``.venv-nemo`` (tests/nemo_env.py), with our core library:
``tests/nemo_consumer/asr_training_step.py`` builds the batch with AsrManifestDataset, the
duration-bucket sampler and the collate function and puts it through NeMo's RNNT and TDT models
(tiny, random, built from config); this test asserts on the shapes, dtypes and loss it reports.
"""

import glob
import math

import pytest

from speechdata.asr.flac import run_asr_flac
from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.stage import build_and_write_asr_manifests
from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from tests.nemo_consumer.asr_training_step import TDT_DURATIONS
from tests.nemo_env import run_in_nemo_env


def tiny_sentencepiece(directory, texts, languages):
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "corpus.txt").write_text("\n".join(texts * 3) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=120,
        hard_vocab_limit=False,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
        user_defined_symbols=[f"<|{lang}|>" for lang in languages],
    )
    processor = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    (directory / "vocab.txt").write_text(
        "\n".join(processor.id_to_piece(i) for i in range(processor.get_piece_size())) + "\n"
    )
    return directory


@pytest.fixture(scope="module")
def sampler_batch(tmp_path_factory, clips):
    from speechdata.io.storage import DataRoot

    tmp = tmp_path_factory.mktemp("asr-smoke")
    data_root = DataRoot(str(tmp / "data"))
    build_segment_tar_sample(str(tmp / "seed"), clips, n_segments=9)
    import_segment_tar_shard(str(tmp / "seed"), data_root, "asr-smoke")
    run_raw_shards(data_root, "asr-smoke")
    run_asr_flac(data_root, "asr-smoke")
    build = build_and_write_asr_manifests(data_root, AsrManifestConfig(validation_share=0.0), combined=True).build
    tokenizer_dir = tiny_sentencepiece(
        tmp / "tokenizer", build.train["text"].to_list(), sorted(set(build.train["lang"]))
    )
    return data_root.path(layout.asr_manifest("train")), tokenizer_dir


@pytest.fixture(scope="module")
def training_steps(sampler_batch) -> dict[str, dict]:
    """What NeMo's tiny RNNT and TDT models saw and returned, from one process in ``.venv-nemo``."""
    manifest_path, tokenizer_dir = sampler_batch
    return run_in_nemo_env("asr_training_step.py", str(manifest_path), str(tokenizer_dir))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["rnnt", "tdt"])
def test_a_sampler_batch_feeds_forward_and_loss(training_steps, model_type):
    step = training_steps[model_type]
    assert step["batch_size"] >= 2 and step["signal_dtype"] == "torch.float32" and step["tokens_dtype"] == "torch.int64"
    assert step["max_token_id"] < step["vocab_size"]  # the blank id is vocab_size
    vocab_plus_blank = step["vocab_size"] + 1
    assert step["joint_shape"] == [
        step["batch_size"],
        step["max_encoded_len"],
        step["max_token_len"] + 1,
        vocab_plus_blank + (len(TDT_DURATIONS) if model_type == "tdt" else 0),
    ]
    assert step["encoded_frames"] == step["max_encoded_len"] and step["min_encoded_len"] > 0
    assert step["joint_finite"]
    if model_type == "rnnt":
        assert step["loss_ndim"] == 0 and math.isfinite(step["loss"])
        assert step["encoder_has_gradient"]


@pytest.mark.slow
def test_nemo_reads_the_per_shard_parts_as_it_reads_the_corpus_wide_manifest(sampler_batch):
    import json
    import posixpath

    manifest_path, _ = sampler_batch
    parts = sorted(glob.glob(posixpath.join(posixpath.dirname(manifest_path), "parts", "train", "*.jsonl")))
    items = run_in_nemo_env("read_asr_parts.py", json.dumps(parts))
    assert parts and items and all(item["exists"] for item in items)
    with open(manifest_path.removesuffix(".parquet") + ".jsonl") as handle:
        whole = [json.loads(line) for line in handle]
    directory = posixpath.dirname(manifest_path)
    assert [posixpath.normpath(item["audio_file"]) for item in items] == [
        posixpath.normpath(posixpath.join(directory, row["audio_filepath"])) for row in whole
    ]
    assert [item["duration"] for item in items] == [row["duration"] for row in whole]
