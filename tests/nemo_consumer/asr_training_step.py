"""A sampler batch from our ASR manifest through a tiny NeMo transducer's forward, joint and loss.

Runs in the trainer's environment: our core library (AsrManifestDataset, the duration-bucket
sampler, the collate function) feeding NeMo 3.0's ``EncDecRNNTBPEModel`` on the CPU. The models
are tiny (1 Conformer layer, d_model 32), randomly initialised, built from config: this proves
shapes, dtypes and padding are what NeMo's RNNT/TDT training step expects, not accuracy. NeMo
3.0's TDT loss runs only on CUDA (both its numba kernel and its PyTorch reference call ``.cuda()``),
so on the CPU the TDT model is checked through forward and joint and the loss is the RNNT model's.

Arguments: the train manifest and the SentencePiece tokenizer directory. Writes, per model type,
the batch's and outputs' shapes and dtypes, the loss, and whether the gradient reached the encoder.
"""

import json
import sys

import torch

from speechdata.asr.dataset import AsrManifestDataset, collate_asr_batch
from speechdata.asr.sampler import DurationBucketBatchSampler

TDT_DURATIONS = [0, 1, 2, 3, 4]
# NeMo's 80-band log-mel at 16 kHz, 10 ms stride, as parakeet uses it (no dither), at 40 bands.
PREPROCESSOR = {
    "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
    "sample_rate": 16_000,
    "normalize": "per_feature",
    "window_size": 0.025,
    "window_stride": 0.01,
    "window": "hann",
    "features": 40,
    "n_fft": 512,
    "dither": 0.0,
    "pad_to": 0,
}


def tiny_transducer(tokenizer_dir: str, tdt: bool):
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    extra = len(TDT_DURATIONS) if tdt else 0
    config = {
        "sample_rate": 16_000,
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "train_ds": None,
        "validation_ds": None,
        "test_ds": None,
        "optim": None,
        "model_defaults": {"enc_hidden": 32, "pred_hidden": 32, "joint_hidden": 32},
        "preprocessor": PREPROCESSOR,
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


def training_step(manifest_path: str, tokenizer_dir: str, tdt: bool) -> dict:
    model = tiny_transducer(tokenizer_dir, tdt)
    dataset = AsrManifestDataset(manifest_path, model.tokenizer)
    sampler = DurationBucketBatchSampler(dataset.durations_s, dataset.languages, max_batch_duration_s=12.0, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_asr_batch)
    signal, signal_len, tokens, token_len = max(loader, key=lambda batch: batch[0].shape[0])

    model.train()
    encoded, encoded_len = model.forward(input_signal=signal, input_signal_length=signal_len)
    decoder, target_len, _ = model.decoder(targets=tokens, target_length=token_len)
    joint = model.joint(encoder_outputs=encoded, decoder_outputs=decoder)
    step = {
        "batch_size": signal.shape[0],
        "signal_dtype": str(signal.dtype),
        "tokens_dtype": str(tokens.dtype),
        "max_token_id": int(tokens.max()),
        "vocab_size": model.tokenizer.vocab_size,
        "max_token_len": int(token_len.max()),
        "encoded_frames": encoded.shape[-1],
        "max_encoded_len": int(encoded_len.max()),
        "min_encoded_len": int(encoded_len.min()),
        "joint_shape": list(joint.shape),
        "joint_finite": bool(torch.isfinite(joint).all()),
    }
    if not tdt:
        loss = model.loss(log_probs=joint, targets=tokens, input_lengths=encoded_len, target_lengths=target_len)
        loss.backward()
        step["loss_ndim"] = loss.ndim
        step["loss"] = float(loss)
        step["encoder_has_gradient"] = model.encoder.pre_encode.out.weight.grad is not None
    return step


def main(result_path: str, manifest_path: str, tokenizer_dir: str) -> None:
    result = {name: training_step(manifest_path, tokenizer_dir, tdt) for name, tdt in (("rnnt", False), ("tdt", True))}
    with open(result_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
