"""Read bridge tars in training code: a WebDataset pipeline, or one sample by byte range.

No Dagster needed. Every member decodes to numpy with the contract's dtypes and shapes:
``wav`` float32 [n] (24 kHz), ``qwen`` float16 [T, H], ``wavlm`` float16 [F, D], ``tokens``/``dur``
int32 [T], ``grid`` int32 [F], ``json`` dict.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable

import numpy as np
import soundfile as sf

from speechdata.io.webdataset_fsspec import register_fsspec_schemes, register_if_webdataset_loaded

register_if_webdataset_loaded()

ARRAY_MEMBERS = ("qwen.npy", "wavlm.npy", "tokens.npy", "grid.npy", "dur.npy")


def decode_member(extension: str, data: bytes):
    """Decode one tar member by its extension (the part of the name after the key's first dot)."""
    if extension.endswith(".npy"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    if extension == "wav":
        samples, _ = sf.read(io.BytesIO(data), dtype="float32")
        return samples
    if extension == "json":
        return json.loads(data)
    return data


def decode_sample(sample: dict) -> dict:
    """A raw WebDataset sample (``__key__``, ``__url__``, bytes per extension) -> numpy and dicts."""
    decoded = {"__key__": sample["__key__"], "__url__": sample.get("__url__")}
    for extension, data in sample.items():
        if not extension.startswith("__"):
            decoded[extension.removesuffix(".npy")] = decode_member(extension, data)
    return decoded


def bridge_dataset(
    urls: Iterable[str] | str,
    *,
    languages: Iterable[str] | None = None,
    shuffle: int = 0,
    shardshuffle: bool | int = False,
    seed: int = 0,
):
    """A ``webdataset.WebDataset`` of decoded bridge samples, optionally language-filtered and shuffled.

    Works with a multi-worker ``torch.utils.data.DataLoader`` (tars are split between workers).
    """
    import webdataset as wds

    register_fsspec_schemes()
    url_list = [urls] if isinstance(urls, str) else list(urls)
    wanted = set(languages) if languages is not None else None
    dataset = wds.WebDataset(
        url_list,
        shardshuffle=shardshuffle if shardshuffle else False,
        seed=seed,
        nodesplitter=wds.split_by_node,
        workersplitter=wds.split_by_worker,
        empty_check=False,
    ).map(decode_sample)
    if wanted is not None:
        dataset = dataset.select(lambda sample: sample["json"].get("language") in wanted)
    if shuffle:
        dataset = dataset.shuffle(shuffle, seed=seed)
    return dataset


def read_sample_at(url: str, offset: int, size: int, data_root: str | None = None) -> dict:
    """One sample by its manifest byte range (a ranged read; the rest of the tar is not touched).

    ``url``: a manifest's ``tar_url`` (relative to the data root: give ``data_root``) or a full URL.
    """
    import fsspec

    if data_root is not None:
        from speechdata.bridge.manifest import tar_location

        url = tar_location(data_root, url)
    elif "://" not in url and not url.startswith("/"):
        raise ValueError(f"{url!r} is relative to a data root: pass data_root=")

    with fsspec.open(url, "rb") as handle:
        handle.seek(offset)
        chunk = handle.read(size)
    sample: dict = {}
    with tarfile.open(fileobj=io.BytesIO(chunk), mode="r:") as tar:
        for member in tar.getmembers():
            key, extension = member.name.split(".", 1)
            sample["__key__"] = key
            sample[extension] = tar.extractfile(member).read()
    return decode_sample(sample)


def verify_bridge_tars(urls: Iterable[str], expected_keys: set[str]) -> list[str]:
    """Read every tar with the real ``webdataset`` reader; return problems as sentences (empty = sound).

    Checks: every expected key is there once and nothing else; every member decodes; the arrays
    agree (``len(dur) == len(tokens) == qwen rows``, ``len(grid) == wavlm rows == json n_frames``,
    ``sum(dur) + silence == F``); dtypes are float16 / int32.
    """
    problems: list[str] = []
    seen: set[str] = set()
    urls = list(urls)
    # webdataset cannot open an empty shard list; no tar holds no sample.
    for sample in bridge_dataset(urls) if urls else ():
        key = sample["__key__"]
        if key in seen:
            problems.append(f"{key}: appears twice")
        seen.add(key)
        try:
            qwen, wavlm, tokens, grid, dur, info = (
                sample["qwen"],
                sample["wavlm"],
                sample["tokens"],
                sample["grid"],
                sample["dur"],
                sample["json"],
            )
        except KeyError as exc:
            problems.append(f"{key}: member {exc} missing")
            continue
        if not (len(dur) == len(tokens) == qwen.shape[0] == info["n_tokens"]):
            problems.append(f"{key}: T disagrees (dur {len(dur)}, tokens {len(tokens)}, qwen {qwen.shape[0]})")
        if not (len(grid) == wavlm.shape[0] == info["n_frames"]):
            problems.append(f"{key}: F disagrees (grid {len(grid)}, wavlm {wavlm.shape[0]}, json {info['n_frames']})")
        if int(dur.sum()) + int((grid == -1).sum()) != len(grid):
            problems.append(f"{key}: sum(dur) + silence != F")
        if qwen.dtype != np.float16 or wavlm.dtype != np.float16 or tokens.dtype != np.int32 or grid.dtype != np.int32:
            problems.append(f"{key}: wrong dtypes")
    missing, extra = expected_keys - seen, seen - expected_keys
    if missing:
        problems.append(f"{len(missing)} samples missing from the tars, e.g. {sorted(missing)[:3]}")
    if extra:
        problems.append(f"{len(extra)} unexpected samples in the tars, e.g. {sorted(extra)[:3]}")
    return problems
