"""A sampler batch from the real manifest feeds a tiny NeMo transducer's forward and loss on the CPU.

The models are tiny (1 Conformer layer, d_model 32), randomly initialised, built from config: this
proves shapes, dtypes and padding are what NeMo's RNNT/TDT training step expects, not accuracy.
NeMo 3.0's TDT loss runs only on CUDA (both its numba kernel and its PyTorch reference call
``.cuda()``), so on the CPU the TDT model is checked through forward and joint (token logits plus
duration logits) and the loss is the RNNT model's.
"""

import pytest
import torch

from speechdata.alignment.acoustic_models import mel_preprocessor_config
from speechdata.asr.dataset import AsrManifestDataset, collate_asr_batch
from speechdata.asr.flac import run_asr_flac
from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.sampler import DurationBucketBatchSampler
from speechdata.asr.stage import build_and_write_asr_manifests
from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards

TDT_DURATIONS = [0, 1, 2, 3, 4]


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


def tiny_transducer(tokenizer_dir, tdt: bool):
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    extra = len(TDT_DURATIONS) if tdt else 0
    config = {
        "sample_rate": 16_000,
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "train_ds": None,
        "validation_ds": None,
        "test_ds": None,
        "optim": None,
        "model_defaults": {"enc_hidden": 32, "pred_hidden": 32, "joint_hidden": 32},
        "preprocessor": mel_preprocessor_config() | {"features": 40},
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 40,
            "n_layers": 1,
            "d_model": 32,
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": 32,
            "ff_expansion_factor": 2,
            "self_attention_model": "rel_pos",
            "n_heads": 2,
            "att_context_size": [-1, -1],
            "conv_kernel_size": 9,
            "dropout": 0.0,
            "dropout_pre_encoder": 0.0,
            "dropout_emb": 0.0,
            "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {"pred_hidden": 32, "pred_rnn_layers": 1, "t_max": None, "dropout": 0.0},
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": False,
            "fused_batch_size": -1,
            "num_extra_outputs": extra,
            "jointnet": {"joint_hidden": 32, "activation": "relu", "dropout": 0.0},
        },
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        # NeMo's PyTorch reference RNNT loss: the numba kernel's first-call JIT costs ~15 s on a small CPU.
        "loss": {"loss_name": "pytorch"},
    }
    if tdt:
        config["model_defaults"]["tdt_durations"] = TDT_DURATIONS
        config["decoding"].update(model_type="tdt", durations=TDT_DURATIONS)
        config["loss"] = {"loss_name": "tdt", "tdt_kwargs": {"durations": TDT_DURATIONS, "sigma": 0.02, "omega": 0.1}}
    torch.manual_seed(0)
    return EncDecRNNTBPEModel(cfg=OmegaConf.create(config))


@pytest.fixture(scope="module")
def sampler_batch(tmp_path_factory, clips):
    from speechdata.io.storage import DataRoot

    tmp = tmp_path_factory.mktemp("asr-smoke")
    data_root = DataRoot(str(tmp / "data"))
    build_segment_tar_sample(str(tmp / "seed"), clips, n_segments=9)
    import_segment_tar_shard(str(tmp / "seed"), data_root, "asr-smoke")
    run_raw_shards(data_root, "asr-smoke")
    run_asr_flac(data_root, "asr-smoke")
    build = build_and_write_asr_manifests(data_root, AsrManifestConfig(validation_share=0.0)).build
    tokenizer_dir = tiny_sentencepiece(
        tmp / "tokenizer", build.train["text"].to_list(), sorted(set(build.train["lang"]))
    )
    return data_root.path(layout.asr_manifest("train")), tokenizer_dir


@pytest.mark.parametrize("tdt", [False, True], ids=["rnnt", "tdt"])
def test_a_sampler_batch_feeds_forward_and_loss(sampler_batch, tdt):
    manifest_path, tokenizer_dir = sampler_batch
    model = tiny_transducer(tokenizer_dir, tdt)
    dataset = AsrManifestDataset(manifest_path, model.tokenizer)
    sampler = DurationBucketBatchSampler(dataset.durations_s, dataset.languages, max_batch_duration_s=12.0, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_asr_batch)
    signal, signal_len, tokens, token_len = max(loader, key=lambda batch: batch[0].shape[0])
    assert signal.shape[0] >= 2 and signal.dtype == torch.float32 and tokens.dtype == torch.long
    assert int(tokens.max()) < model.tokenizer.vocab_size  # the blank id is vocab_size

    model.train()
    encoded, encoded_len = model.forward(input_signal=signal, input_signal_length=signal_len)
    decoder, target_len, _ = model.decoder(targets=tokens, target_length=token_len)
    joint = model.joint(encoder_outputs=encoded, decoder_outputs=decoder)
    vocab_plus_blank = model.tokenizer.vocab_size + 1
    assert joint.shape == (
        signal.shape[0],
        int(encoded_len.max()),
        int(token_len.max()) + 1,
        vocab_plus_blank + (len(TDT_DURATIONS) if tdt else 0),
    )
    assert encoded.shape[-1] == int(encoded_len.max()) and bool((encoded_len > 0).all())
    if tdt:
        assert torch.isfinite(joint).all()
        return
    loss = model.loss(log_probs=joint, targets=tokens, input_lengths=encoded_len, target_lengths=target_len)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.encoder.pre_encode.out.weight.grad is not None
