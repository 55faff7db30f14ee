"""The GPU stages' models written once from random weights at their real configs, then timed loading.

Why: under today's orchestration every GPU asset loads its model once per run of 4 shards, so a
load is a fixed cost paid per run; a resident worker pays it once. This measures it without a hub
download: each model is built from its real config (sizes from the model cards, written out in
:mod:`benchmarks.gpu_features` and :mod:`benchmarks.gpu_ctc`), given random weights and saved in its
real on-disk format (Hugging Face safetensors, in the dtype its hub checkpoint stores) under
``.cache/bench-models/`` (git-ignored; built once, atomically, and reused). A load is then timed in a
fresh interpreter, through the same call the platform's resource makes:

* ``qwen3-1.7b``: ``speechdata.features.models.load_pretrained`` (``AutoModel``), as ``QwenEncoder``;
  stored bf16 as a ``Qwen3ForCausalLM`` with tied embeddings, like ``Qwen/Qwen3-1.7B``;
* ``wavlm-large``: the same call, as ``WavLMEncoder``; stored float32 like ``microsoft/wavlm-large``;
* ``parakeet-ctc-1.1b``: ``ParakeetForCTC.from_pretrained`` (the aligner's transformers port;
  42 layers, d_model 1024, 8 heads, 8x subsampling, 1 024 labels + blank); stored float32 like the
  hub's HF export, loaded in float32 as the alignment stage runs it;
* ``metricx-24-hybrid-xl``: ``speechdata.translation.metricx.load_metricx`` (``MT5ForRegression``
  at mT5-XL's sizes, untied LM head), as ``MetricXResource``; stored bf16 like the ``-bf16``
  checkpoint. The folder holds the tiny profile's tokenizer (its score token id is written into
  the config), so the tokenizer part of the load is smaller than mT5-XL's real one.

Loads ask for the dtype the resources ask for on a GPU (``TorchDeviceResource.dtype()``: bfloat16;
the CTC model float32) and land in host memory: the copy to the device is not measured here.

Each load is timed twice in fresh interpreters: ``cold`` after the model's files are dropped from
the page cache (``posix_fadvise(DONTNEED)``, as a node that has not read them), ``warm`` right after
(what a second run on the same node pays). Reported: seconds, GB on disk, GB/s, parameters, the
child's peak RSS and its import time of torch + transformers (paid before any load).

    python -m benchmarks.model_load_costs write|load <model> <folder> [--tiny]   (one child's work)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import stdout_to_stderr

MODEL_CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "bench-models"
GB = 1e9

# mT5-XL's sizes (google/mt5-xl config.json), which MetricX-24 hybrid XL keeps; its LM head is untied.
MT5_XL = dict(
    vocab_size=250_112,
    d_model=2048,
    d_kv=64,
    d_ff=5120,
    num_layers=24,
    num_decoder_layers=24,
    num_heads=32,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
)
# nvidia/parakeet-ctc-1.1b (FastConformer CTC) at the model card's sizes, as benchmarks/gpu_ctc.py.
PARAKEET_CTC_1_1B = dict(
    hidden_size=1024,
    num_hidden_layers=42,
    num_attention_heads=8,
    intermediate_size=4096,
    conv_kernel_size=9,
    subsampling_factor=8,
    subsampling_conv_channels=256,
    num_mel_bins=80,
)
PARAKEET_LABELS = 1024  # BPE pieces; the blank is one more


@dataclass(frozen=True)
class ModelSpec:
    name: str
    stored_dtype: str
    load_dtype: str
    stage: str | None
    """The per-shard GPU asset that loads it (None: not in the per-shard job)."""


MODELS = (
    ModelSpec("parakeet-ctc-1.1b", "float32", "float32", "alignments"),
    ModelSpec("qwen3-1.7b", "bfloat16", "bfloat16", "qwen_hidden_states"),
    ModelSpec("wavlm-large", "float32", "bfloat16", "wavlm_features"),
    ModelSpec("metricx-24-hybrid-xl", "bfloat16", "bfloat16", None),
)
MODELS_BY_NAME = {spec.name: spec for spec in MODELS}


@contextlib.contextmanager
def default_dtype(dtype):
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def qwen_config(tiny: bool):
    from transformers import Qwen3Config

    from benchmarks.gpu_features import QWEN3_1_7B

    if tiny:
        return Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        )  # fmt: skip
    return Qwen3Config(**QWEN3_1_7B)


def wavlm_config(tiny: bool):
    from transformers import WavLMConfig

    from benchmarks.gpu_features import WAVLM_LARGE

    if tiny:
        return WavLMConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32,) * 7,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="layer",
            do_stable_layer_norm=True,
        )  # fmt: skip
    return WavLMConfig(**WAVLM_LARGE)


def parakeet_config(tiny: bool):
    from transformers import ParakeetCTCConfig, ParakeetEncoderConfig

    sizes = dict(PARAKEET_CTC_1_1B)
    if tiny:
        sizes.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        sizes.update(subsampling_conv_channels=16)
    return ParakeetCTCConfig(
        vocab_size=PARAKEET_LABELS + 1, pad_token_id=PARAKEET_LABELS, encoder_config=ParakeetEncoderConfig(**sizes)
    )


def metricx_config(tiny: bool, score_token_id: int):
    from transformers import MT5Config

    from speechdata.translation.metricx import tiny_metricx_config

    if tiny:
        return tiny_metricx_config(512, score_token_id)
    config = MT5Config(**MT5_XL, architectures=["MT5ForRegression"])
    config.metricx_score_token_id = score_token_id
    return config


def build_model(name: str, tiny: bool):
    """The model with random weights, in its stored dtype, as it goes to disk."""
    import torch

    spec = MODELS_BY_NAME[name]
    with default_dtype(_dtype(spec.stored_dtype)), torch.no_grad():
        if name == "qwen3-1.7b":
            from transformers import Qwen3ForCausalLM

            return Qwen3ForCausalLM(qwen_config(tiny)).eval()
        if name == "wavlm-large":
            from transformers import WavLMModel

            return WavLMModel(wavlm_config(tiny)).eval()
        if name == "parakeet-ctc-1.1b":
            from transformers import ParakeetForCTC

            return ParakeetForCTC(parakeet_config(tiny)).eval()
        if name == "metricx-24-hybrid-xl":
            from speechdata.translation.metricx import SCORE_TOKEN, MT5ForRegression, build_tiny_tokenizer

            score_token_id = build_tiny_tokenizer().convert_tokens_to_ids(SCORE_TOKEN)
            return MT5ForRegression(metricx_config(tiny, score_token_id)).eval()
    raise ValueError(f"no such model: {name!r} (have {', '.join(MODELS_BY_NAME)})")


def expected_parameters(name: str, tiny: bool) -> int:
    """Parameters of the model the platform gets from a load at the real (or tiny) config, counted on
    the meta device (no memory): the loaded module is ``AutoModel``'s base model for Qwen and WavLM."""
    import torch

    with torch.device("meta"):
        if name == "qwen3-1.7b":
            from transformers import Qwen3Model

            model = Qwen3Model(qwen_config(tiny))
        elif name == "wavlm-large":
            from transformers import WavLMModel

            model = WavLMModel(wavlm_config(tiny))
        elif name == "parakeet-ctc-1.1b":
            from transformers import ParakeetForCTC

            model = ParakeetForCTC(parakeet_config(tiny))
        else:
            from speechdata.translation.metricx import MT5ForRegression

            model = MT5ForRegression(metricx_config(tiny, 0))
    return sum(p.numel() for p in model.parameters())


def write_model(name: str, folder: Path, tiny: bool) -> None:
    model = build_model(name, tiny)
    model.save_pretrained(folder)
    if name == "metricx-24-hybrid-xl":
        from speechdata.translation.metricx import build_tiny_tokenizer

        build_tiny_tokenizer().save_pretrained(folder)


def load_model(name: str, folder: Path):
    """One load through the call the platform's resource makes, onto the CPU."""
    spec = MODELS_BY_NAME[name]
    dtype = _dtype(spec.load_dtype)
    if name in ("qwen3-1.7b", "wavlm-large"):
        from speechdata.features.models import load_pretrained

        return load_pretrained(name.split("-")[0], str(folder), None, True, dtype)
    if name == "parakeet-ctc-1.1b":
        from transformers import ParakeetForCTC

        return ParakeetForCTC.from_pretrained(str(folder), local_files_only=True, dtype=dtype).eval()
    from speechdata.translation.metricx import load_metricx

    model, _tokenizer = load_metricx(str(folder), str(folder), local_files_only=True, dtype=dtype)
    return model


def model_folder(name: str, tiny: bool, cache_dir: Path = MODEL_CACHE_DIR) -> Path:
    return cache_dir / (f"tiny-{name}" if tiny else name)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "load"))
    parser.add_argument("model", choices=tuple(MODELS_BY_NAME))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    with stdout_to_stderr():
        started = time.perf_counter()
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import_s = time.perf_counter() - started
        if args.action == "write":
            from speechdata.io.local_cache import build_once

            started = time.perf_counter()
            build_once(args.folder, lambda temp: write_model(args.model, temp, args.tiny))
            record = {"write_s": time.perf_counter() - started}
        else:
            started = time.perf_counter()
            model = load_model(args.model, args.folder)
            load_s = time.perf_counter() - started
            record = {
                "load_s": load_s,
                "import_s": import_s,
                "parameters": sum(p.numel() for p in model.parameters()),
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "class": type(model).__name__,
            }
        record["peak_rss_gb"] = peak_rss_gb()
    print(json.dumps(record), flush=True)


def run_child(action: str, name: str, folder: Path, tiny: bool, timeout_s: float = 3600) -> dict:
    """One write or load in a fresh interpreter (its own peak RSS, nothing already imported or cached)."""
    command = [sys.executable, "-m", "benchmarks.model_load_costs", action, name, str(folder)]
    proc = subprocess.run(
        command + (["--tiny"] if tiny else []), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ensure_written(name: str, tiny: bool, cache_dir: Path = MODEL_CACHE_DIR) -> tuple[Path, float | None]:
    """The model's folder, written first if absent; the write's seconds (None: reused from the cache)."""
    folder = model_folder(name, tiny, cache_dir)
    if folder.exists():
        return folder, None
    return folder, run_child("write", name, folder, tiny)["write_s"]


def significant(value: float) -> float:
    return float(f"{value:.4g}")


def measure_model_load(name: str, tiny: bool, cache_dir: Path = MODEL_CACHE_DIR, warm: bool = True) -> dict:
    """Write (once) and time a cold load of one model, and a warm one after it unless ``warm`` is false."""
    from benchmarks.bench_packing import evict_from_page_cache

    folder, write_s = ensure_written(name, tiny, cache_dir)
    size = folder_bytes(folder)
    evict_from_page_cache(folder)
    cold = run_child("load", name, folder, tiny)
    warm_load = run_child("load", name, folder, tiny) if warm else None
    spec = MODELS_BY_NAME[name]
    return {
        "stage": spec.stage,
        "stored_dtype": spec.stored_dtype,
        "load_dtype": cold["dtype"],
        "class": cold["class"],
        "format": "safetensors" if any(folder.glob("*.safetensors")) else "other",
        "parameters": cold["parameters"],
        "expected_parameters": expected_parameters(name, tiny),
        "disk_gb": significant(size / GB),
        "cold_load_s": round(cold["load_s"], 3),
        "cold_gb_per_s": significant(size / GB / cold["load_s"]),
        "warm_load_s": round(warm_load["load_s"], 3) if warm_load else None,
        "warm_gb_per_s": significant(size / GB / warm_load["load_s"]) if warm_load else None,
        "import_torch_transformers_s": round(cold["import_s"], 3),
        "peak_rss_gb": round(max(cold["peak_rss_gb"], warm_load["peak_rss_gb"] if warm_load else 0.0), 3),
        "write_s": None if write_s is None else round(write_s, 1),
    }


if __name__ == "__main__":
    _child(sys.argv[1:])
