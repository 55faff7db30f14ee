"""The dataset card (``README.md``) whose ``configs`` YAML makes every country a loadable config.

``datasets.load_dataset(<dir or repo>, "<country>")`` reads the card's YAML front matter: each
config lists its splits and the files of each split. The card is written from the files present,
so it always matches the folder, whichever country was built last.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

import pyarrow.parquet as pq
import yaml

from speechdata.hf.files import FILE_NAME
from speechdata.io import layout
from speechdata.io.storage import DataRoot

CARD_FILE = "README.md"


def dataset_layout(data_root: DataRoot, dataset: str) -> tuple[dict[str, dict[str, dict]], dict[str, str]]:
    """``{country: {split: {"files": n, "rows": n, "bytes": n}}}`` from the parquet files present,
    and each country's language (read from its files)."""
    found: dict[str, dict[str, dict]] = defaultdict(dict)
    languages: dict[str, str] = {}
    base = data_root.path(layout.hf_dataset_dir(dataset))
    for path in sorted(data_root.fs.glob(f"{base}/*/*.parquet")):
        match = FILE_NAME.match(PurePosixPath(path).name)
        if not match:
            continue
        country = PurePosixPath(path).parent.name
        entry = found[country].setdefault(match["split"], {"files": 0, "rows": 0, "bytes": 0})
        with data_root.fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            entry["rows"] += parquet.metadata.num_rows
            if country not in languages and parquet.metadata.num_rows:
                languages[country] = parquet.read_row_group(0, columns=["language"])["language"][0].as_py() or ""
        entry["files"] += 1
        entry["bytes"] += int(data_root.fs.size(path))
    return dict(found), languages


def _split_order(split: str) -> tuple[int, int, str]:
    if split in ("test", "validation"):
        return (0 if split == "test" else 1, 0, split)
    number = split.rsplit("_", 1)[-1]
    return (2, int(number) if number.isdigit() else 0, split)


def dataset_card(dataset: str, found: dict[str, dict[str, dict]], languages: dict[str, str]) -> str:
    configs = [
        {
            "config_name": country,
            "data_files": [
                {"split": split, "path": f"{country}/{split}-*.parquet"} for split in sorted(splits, key=_split_order)
            ],
        }
        for country, splits in sorted(found.items())
    ]
    front = {
        "configs": configs,
        "language": sorted({lang for lang in languages.values() if lang}),
        "task_categories": ["automatic-speech-recognition"],
        "pretty_name": dataset,
    }
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# {dataset}",
        "",
        "Short segments (3-20 s by default) cut from long recordings, with human and ASR transcripts, "
        "their CER (from the alignment) and WER (ASR against human). Whole recordings belong to one "
        "split. Train is cut into subsets `train_<n>` by size; each subset is a split.",
        "",
        "```python",
        "import datasets",
        f'ds = datasets.load_dataset("<repo or folder>", "{next(iter(sorted(found)), "<country>")}")',
        "```",
        "",
        "| config | language | split | rows | files | MB |",
        "|---|---|---|---:|---:|---:|",
    ]
    for country, splits in sorted(found.items()):
        for split in sorted(splits, key=_split_order):
            entry = splits[split]
            lines.append(
                f"| {country} | {languages.get(country, '')} | {split} | {entry['rows']} | {entry['files']} | {entry['bytes'] / 1e6:.1f} |"
            )
    return "\n".join(lines) + "\n"


def write_dataset_card(data_root: DataRoot, dataset: str) -> str:
    """Write ``hf/<dataset>/README.md`` for the files present; returns its path in the repo."""
    card = dataset_card(dataset, *dataset_layout(data_root, dataset))
    data_root.write_bytes(layout.hf_dataset_file(dataset, CARD_FILE), card.encode("utf-8"))
    return CARD_FILE
