"""The GPU stages' models written once from random weights at their real configs, then timed loading.

Why: under today's orchestration every GPU asset loads its model once per run of 4 shards, so a
load is a fixed cost paid per run; a resident worker pays it once. This measures it without a hub
download: each model is built from its real config (sizes from the model cards, written out in
:mod:`benchmarks.capacity.gpu_features` and :mod:`benchmarks.capacity.gpu_ctc`), given random weights and saved in its
real on-disk format (Hugging Face safetensors, in the dtype its hub checkpoint stores) under
``.cache/bench-models/`` (git-ignored; built once, atomically, and reused). A load is then timed in a
fresh interpreter, through the same call the platform's resource makes:

* ``qwen3-1.7b``: ``speechdata.features.models.load_pretrained`` (``AutoModel``), as ``QwenEncoder``;
  stored bf16 as a ``Qwen3ForCausalLM`` with tied embeddings, like ``Qwen/Qwen3-1.7B``;
* ``wavlm-large``: the same call, as ``WavLMEncoder``; stored float32 like ``microsoft/wavlm-large``;
* ``parakeet-ctc-1.1b``: ``ParakeetForCTC.from_pretrained`` in float32, as
  ``speechdata.alignment.acoustic_models.load_ctc_model`` calls it (its small feature extractor and
  tokenizer are not written); 42 layers, d_model 1024, 8 heads, 8x subsampling, 1 024 labels +
  blank; stored float32 like the hub's transformers export;
* ``metricx-24-hybrid-xl``: ``speechdata.translation.metricx.load_metricx`` (``MT5ForRegression``
  at mT5-XL's sizes, untied LM head), as ``MetricXResource``; stored bf16 like the ``-bf16``
  checkpoint. The folder holds the tiny profile's tokenizer (its score token id is written into
  the config), so the tokenizer part of the load is smaller than mT5-XL's real one.

Loads ask for the dtype the resources ask for on a GPU (``TorchDeviceResource.dtype()``: bfloat16;
the CTC model float32) and land in host memory: the copy to the device is not measured here.

A load is timed until every weight is in the process's own memory (``from_pretrained`` alone is
reported beside it: a load that keeps the stored dtype maps the file and reads it lazily, so it
returns before the bytes are read, and a GPU worker's copy to the device reads them all).
Each load is timed twice in fresh interpreters: ``cold`` after the model's files are dropped from
the page cache (``posix_fadvise(DONTNEED)``, as a node that has not read them), ``warm`` right after
(what a second run on the same node pays). Reported: seconds, GB on disk, GB/s, parameters, the
child's peak RSS and its import time of torch + transformers (paid before any load).

    python -m benchmarks.capacity.model_load_costs write|load <cache folder> <model>... [--tiny]   (a child's work)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import peak_rss_mb, stdout_to_stderr

MODEL_CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "bench-models"
GB = 1e9
SHARD_BYTES = 2 * 10**9  # hub checkpoints come in shards of a few GB (Qwen3-1.7B: 2 files)

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
# nvidia/parakeet-ctc-1.1b (FastConformer CTC) at the model card's sizes, as benchmarks/capacity/gpu_ctc.py.
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

    from benchmarks.capacity.gpu_features import QWEN3_1_7B

    if tiny:
        return Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        )  # fmt: skip
    return Qwen3Config(**QWEN3_1_7B)


def wavlm_config(tiny: bool):
    from transformers import WavLMConfig

    from benchmarks.capacity.gpu_features import WAVLM_LARGE

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


ARCHITECTURE_OF = {
    "qwen3-1.7b": "Qwen3ForCausalLM",
    "wavlm-large": "WavLMModel",
    "parakeet-ctc-1.1b": "ParakeetForCTC",
    "metricx-24-hybrid-xl": "MT5ForRegression",
}


def model_config(name: str, tiny: bool):
    if name == "qwen3-1.7b":
        return qwen_config(tiny)
    if name == "wavlm-large":
        return wavlm_config(tiny)
    if name == "parakeet-ctc-1.1b":
        return parakeet_config(tiny)
    if name == "metricx-24-hybrid-xl":
        from speechdata.translation.metricx import SCORE_TOKEN, build_tiny_tokenizer

        return metricx_config(tiny, build_tiny_tokenizer().convert_tokens_to_ids(SCORE_TOKEN))
    raise ValueError(f"no such model: {name!r} (have {', '.join(MODELS_BY_NAME)})")


def model_class(name: str):
    if name == "metricx-24-hybrid-xl":
        from speechdata.translation.metricx import MT5ForRegression

        return MT5ForRegression
    import transformers

    return getattr(transformers, ARCHITECTURE_OF[name])


def build_model(name: str, tiny: bool):
    """The model with random weights, in its stored dtype (on the meta device inside ``torch.device("meta")``)."""
    import torch

    with default_dtype(_dtype(MODELS_BY_NAME[name].stored_dtype)), torch.no_grad():
        return model_class(name)(model_config(name, tiny)).eval()


def expected_parameters(name: str, tiny: bool) -> int:
    """Parameters of the model the platform gets from a load at the real (or tiny) config, counted on
    the meta device (no memory): the loaded module is ``AutoModel``'s base model for Qwen and WavLM."""
    import torch
    import transformers

    loaded_class = {"qwen3-1.7b": transformers.Qwen3Model}.get(name) or model_class(name)
    with torch.device("meta"):
        model = loaded_class(model_config(name, tiny))
    return sum(p.numel() for p in model.parameters())


def saved_by_save_pretrained(name: str) -> set[str]:
    """The tiny model's keys that ``save_pretrained`` writes (tied copies left out), as the rule for
    which keys a checkpoint of this architecture holds."""
    from safetensors import safe_open

    with tempfile.TemporaryDirectory(prefix="bench-model-keys-") as work:
        build_model(name, tiny=True).save_pretrained(work)
        keys = set()
        for path in Path(work).glob("*.safetensors"):
            with safe_open(str(path), "pt") as checkpoint:
                keys.update(checkpoint.keys())
    return keys


def checkpoint_tensors(name: str, tiny: bool) -> dict[str, tuple[tuple[int, ...], object]]:
    """``{key: (shape, dtype)}`` of the checkpoint ``save_pretrained`` would write, from a model on the
    meta device (no memory, no initialisation): every state-dict entry but the tied copies."""
    import torch

    spec = MODELS_BY_NAME[name]
    with torch.device("meta"):
        tiny_state = build_model(name, tiny=True).state_dict()
        state = tiny_state if tiny else build_model(name, tiny=False).state_dict()
    saved = saved_by_save_pretrained(name)
    if not saved <= set(tiny_state):
        raise ValueError(f"{name}: save_pretrained renames keys ({sorted(saved - set(tiny_state))[:3]}); not supported")
    tied = set(tiny_state) - saved
    return {
        key: (tuple(tensor.shape), tensor.dtype if not tensor.is_floating_point() else _dtype(spec.stored_dtype))
        for key, tensor in state.items()
        if key not in tied
    }


def write_model(name: str, folder: Path, tiny: bool) -> None:
    """The model's checkpoint as the hub stores it: ``config.json`` and safetensors shards of at most
    :data:`SHARD_BYTES` with their index, written tensor by tensor from random values, so a 7.5 GB
    model needs one shard's memory and no initialisation pass."""
    import torch
    from safetensors.torch import save_file

    spec = MODELS_BY_NAME[name]
    tensors = checkpoint_tensors(name, tiny)
    pool = (0.02 * torch.randn(1 << 22, generator=torch.Generator().manual_seed(0))).to(_dtype(spec.stored_dtype))
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for key, (shape, dtype) in tensors.items():
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if shards[-1] and shard_bytes + size > SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(key)
        shard_bytes += size
    folder.mkdir(parents=True, exist_ok=True)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map, total = {}, 0
    for file_name, keys in zip(names, shards, strict=True):
        shard = {}
        for key in keys:
            shape, dtype = tensors[key]
            count = math.prod(shape)
            if dtype.is_floating_point:
                values = pool.repeat(-(-count // pool.numel()))[:count].reshape(shape).clone()
            else:
                values = torch.zeros(shape, dtype=dtype)
            shard[key] = values
            total += values.numel() * values.element_size()
            weight_map[key] = file_name
        save_file(shard, str(folder / file_name), metadata={"format": "pt"})
        del shard
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = model_config(name, tiny)
    config.dtype = _dtype(spec.stored_dtype)
    config.architectures = [ARCHITECTURE_OF[name]]
    config.save_pretrained(folder)
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


def read_every_weight(model) -> None:
    """Copy every weight into the process's own memory.

    A load that keeps the checkpoint's dtype maps the safetensors file and reads it lazily, on first
    use, so ``from_pretrained`` can return before most bytes left the disk; a GPU worker's copy to
    the device reads every byte. A load is timed until then.
    """
    import itertools

    import torch

    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            tensor.data = tensor.data.clone()


def model_folder(name: str, tiny: bool, cache_dir: Path = MODEL_CACHE_DIR) -> Path:
    return cache_dir / (f"tiny-{name}" if tiny else name)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def peak_rss_gb() -> float:
    return peak_rss_mb() * 2**20 / GB


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "load", "write-then-load"))
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("models", nargs="+", choices=tuple(MODELS_BY_NAME))
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    with stdout_to_stderr():
        started = time.perf_counter()
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import_s = time.perf_counter() - started
        if args.action == "write-then-load":
            # The smoke run's shortcut: every missing model written, dropped from the page cache, then
            # every model loaded, in this one interpreter (its imports paid once).
            from benchmarks.stages.bench_packing import evict_from_page_cache

            missing = [name for name in args.models if not model_folder(name, args.tiny, args.cache_dir).exists()]
            writes = _write_or_load("write", missing, args.tiny, args.cache_dir, import_s)
            for name in args.models:
                evict_from_page_cache(model_folder(name, args.tiny, args.cache_dir))
            records = {
                "write": writes,
                "load": _write_or_load("load", args.models, args.tiny, args.cache_dir, import_s),
            }
        else:
            records = _write_or_load(args.action, args.models, args.tiny, args.cache_dir, import_s)
    print(json.dumps(records), flush=True)


def _write_or_load(action: str, names: list[str], tiny: bool, cache_dir: Path, import_s: float) -> dict:
    records = {}
    for name in names:
        folder = model_folder(name, tiny, cache_dir)
        started = time.perf_counter()
        if action == "write":
            from speechdata.io.local_cache import build_once

            build_once(folder, lambda temp, name=name: write_model(name, temp, tiny))
            records[name] = {"write_s": time.perf_counter() - started}
        else:
            model = load_model(name, folder)
            from_pretrained_s = time.perf_counter() - started
            read_every_weight(model)
            records[name] = {
                "load_s": time.perf_counter() - started,
                "from_pretrained_s": from_pretrained_s,
                "import_s": import_s,
                "parameters": sum(p.numel() for p in model.parameters()),
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "class": type(model).__name__,
            }
            del model
        records[name]["peak_rss_gb"] = peak_rss_gb()
    return records


def run_child(action: str, names: list[str], tiny: bool, cache_dir: Path, timeout_s: float = 3600) -> dict:
    """Writes or loads in a fresh interpreter, one model after another: ``{name: figures}``."""
    command = [sys.executable, "-m", "benchmarks.capacity.model_load_costs", action, str(cache_dir), *names]
    command += ["--tiny"] if tiny else []
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def in_children(action: str, names: list[str], tiny: bool, cache_dir: Path, one_process: bool) -> dict:
    if not names:
        return {}
    if one_process:
        return run_child(action, names, tiny, cache_dir)
    return {name: run_child(action, [name], tiny, cache_dir)[name] for name in names}


def significant(value: float) -> float:
    return float(f"{value:.4g}")


def measure_model_loads(
    names: list[str], tiny: bool, cache_dir: Path = MODEL_CACHE_DIR, warm: bool = True, one_process: bool = False
) -> dict:
    """Write each model once (reused after), then time a cold load and, if ``warm``, a warm one.

    ``one_process``: every model's write, then every cold load, all in one interpreter (a smoke run's
    shortcut: the load is cold for the page cache only, and the peak RSS covers the models written and
    loaded before too). Otherwise one interpreter per model and action, so each load starts from
    nothing imported and its peak RSS is its own.
    """
    from benchmarks.stages.bench_packing import evict_from_page_cache

    if one_process:
        together = run_child("write-then-load", names, tiny, cache_dir)
        writes, cold = together["write"], together["load"]
    else:
        missing = [name for name in names if not model_folder(name, tiny, cache_dir).exists()]
        writes = in_children("write", missing, tiny, cache_dir, one_process)
        for name in names:
            evict_from_page_cache(model_folder(name, tiny, cache_dir))
        cold = in_children("load", names, tiny, cache_dir, one_process)
    warm_loads = in_children("load", names, tiny, cache_dir, one_process) if warm else {}
    figures = {}
    for name in names:
        folder, spec, first, again = (
            model_folder(name, tiny, cache_dir),
            MODELS_BY_NAME[name],
            cold[name],
            warm_loads.get(name),
        )
        size = folder_bytes(folder)
        figures[name] = {
            "stage": spec.stage,
            "stored_dtype": spec.stored_dtype,
            "load_dtype": first["dtype"],
            "class": first["class"],
            "format": "safetensors" if any(folder.glob("*.safetensors")) else "other",
            "parameters": first["parameters"],
            "expected_parameters": expected_parameters(name, tiny),
            "disk_gb": significant(size / GB),
            "cold_load_s": round(first["load_s"], 3),
            "cold_from_pretrained_s": round(first["from_pretrained_s"], 3),
            "cold_gb_per_s": significant(size / GB / first["load_s"]),
            "warm_load_s": round(again["load_s"], 3) if again else None,
            "warm_from_pretrained_s": round(again["from_pretrained_s"], 3) if again else None,
            "warm_gb_per_s": significant(size / GB / again["load_s"]) if again else None,
            "import_torch_transformers_s": round(first["import_s"], 3),
            "peak_rss_gb": round(max(first["peak_rss_gb"], again["peak_rss_gb"] if again else 0.0), 3),
            "write_s": round(writes[name]["write_s"], 1) if name in writes else None,
        }
    return figures


if __name__ == "__main__":
    _child(sys.argv[1:])
