"""The dataset card (``README.md``) whose ``configs`` YAML makes every country a loadable config.

``datasets.load_dataset(<dir or repo>, "<country>")`` reads the card's YAML front matter: each
config lists its splits and the files of each split. The card is written from the small summary
each country's build stores (:mod:`speechdata.hf.stats`: rows, bytes and files per split), so it
matches the folder whichever country was built last, and never opens a dataset file. Its metadata is
``huggingface_hub.DatasetCardData`` (the Hub's own schema): license (with ``license_name`` and
``license_link`` whenever it is ``other``) and pretty name (configurable),
languages, task categories, size category, ``configs`` and ``dataset_info`` (each config's
features, read back from its parquet files, and its splits' rows and bytes).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

import pyarrow.parquet as pq

from speechdata.hf.files import FILE_NAME
from speechdata.hf.missing_splits import missing_split_reasons
from speechdata.hf.segment_writer import hf_features
from speechdata.hf.stats import stored_country_stats
from speechdata.io import layout
from speechdata.io.storage import DataRoot

CARD_FILE = "README.md"
PLACEHOLDER_LICENSE_NAME = "license-not-chosen"
PLACEHOLDER_LICENSE_LINK = "LICENSE.md"
"""What the card says for ``license: other`` until a name and link are configured: the Hub requires both
with ``other`` (a lowercase dashed name; a URL or a file in the repo), and these read as what they are."""


def license_fields(license: str, license_name: str | None, license_link: str | None) -> dict[str, str]:
    """The card's license keys: ``other`` always carries ``license_name`` and ``license_link``."""
    fields = {"license": license}
    if license == "other":
        fields["license_name"] = license_name or PLACEHOLDER_LICENSE_NAME
        fields["license_link"] = license_link or PLACEHOLDER_LICENSE_LINK
    else:
        fields.update({k: v for k, v in (("license_name", license_name), ("license_link", license_link)) if v})
    return fields


def dataset_layout(
    data_root: DataRoot, dataset: str, countries: set[str] | None = None
) -> tuple[dict[str, dict[str, dict]], dict[str, str], dict[str, list]]:
    """``{country: {split: {"files": n, "rows": n, "bytes": n}}}`` from the parquet files present
    (of ``countries``, or all), each country's language and features (read from its files)."""
    found: dict[str, dict[str, dict]] = defaultdict(dict)
    languages: dict[str, str] = {}
    features: dict[str, list] = {}
    for path in sorted(data_root.glob(f"{layout.hf_dataset_dir(dataset)}/*/*.parquet")):
        match = FILE_NAME.match(PurePosixPath(path).name)
        country = PurePosixPath(path).parent.name
        if not match or (countries is not None and country not in countries):
            continue
        entry = found[country].setdefault(match["split"], {"files": 0, "rows": 0, "bytes": 0})
        with data_root.fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            entry["rows"] += parquet.metadata.num_rows
            if country not in languages and parquet.metadata.num_rows:
                languages[country] = parquet.read_row_group(0, columns=["language"])["language"][0].as_py() or ""
            if country not in features:
                features[country] = _features_yaml(parquet.schema_arrow)
        entry["files"] += 1
        entry["bytes"] += int(data_root.fs.size(path))
    return dict(found), languages, features


def _features_yaml(schema) -> list:
    """The ``dataset_info.features`` YAML of a parquet file ``datasets`` wrote (its schema metadata)."""
    import datasets

    return datasets.Features.from_arrow_schema(schema)._to_yaml_list()


SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))


def size_category(rows: int) -> str:
    for limit, name in SIZE_CATEGORIES:
        if rows < limit:
            return name
    return "1M<n<10M" if rows < 10_000_000 else "10M<n<100M"


def _split_order(split: str) -> tuple[int, int, str]:
    if split in ("test", "validation"):
        return (0 if split == "test" else 1, 0, split)
    number = split.rsplit("_", 1)[-1]
    return (2, int(number) if number.isdigit() else 0, split)


def dataset_card(
    dataset: str,
    found: dict[str, dict[str, dict]],
    languages: dict[str, str],
    features: dict[str, list] | None = None,
    *,
    license: str = "other",
    license_name: str | None = None,
    license_link: str | None = None,
    pretty_name: str | None = None,
    missing_splits: dict[str, dict[str, str]] | None = None,
) -> str:
    """The card's text; ``missing_splits`` (``{country: {split: why}}``) are stated below the table."""
    from huggingface_hub import DatasetCardData

    configs = [
        {
            "config_name": country,
            "data_files": [
                {"split": split, "path": f"{country}/{split}-*.parquet"} for split in sorted(splits, key=_split_order)
            ],
        }
        for country, splits in sorted(found.items())
    ]
    features = features or {}
    dataset_info = [
        {
            "config_name": country,
            **({"features": features[country]} if country in features else {}),
            "splits": [
                {"name": split, "num_examples": splits[split]["rows"], "num_bytes": splits[split]["bytes"]}
                for split in sorted(splits, key=_split_order)
            ],
        }
        for country, splits in sorted(found.items())
    ]
    total_rows = sum(entry["rows"] for splits in found.values() for entry in splits.values())
    card_data = DatasetCardData(
        language=sorted({lang for lang in languages.values() if lang}),
        **license_fields(license, license_name, license_link),
        pretty_name=pretty_name or dataset,
        task_categories=["automatic-speech-recognition"],
        size_categories=[size_category(total_rows)],
        configs=configs,
        dataset_info=dataset_info,
    )
    lines = [
        "---",
        card_data.to_yaml().rstrip(),
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
        "# decoding `audio` needs torchcodec and FFmpeg's shared libraries (datasets 4 and 5); without them:",
        'raw = ds["test"].cast_column("audio", datasets.Audio(decode=False))  # {"bytes", "path"}: FLAC bytes',
        "```",
        "",
        *(
            [
                f"License: not chosen yet (`{PLACEHOLDER_LICENSE_NAME}`): set `license`, `license_name` and "
                "`license_link` in the hf_dataset_settings resource before sharing this dataset.",
                "",
            ]
            if license == "other" and not license_name
            else []
        ),
        "Column `text` is what to train on: the human transcript (`text_source` `landed`), or, for a "
        "segment landed without one, our aligner's own transcript (a pseudo-label: `text_source` `asr`, "
        "its confidence in `asr_confidence`, `human_transcript` and `wer` empty). Pseudo-labels under "
        "the quality policy's confidence threshold are not published; column `pseudo-labels` counts "
        "those that are.",
        "",
        "| config | language | split | rows | pseudo-labels | files | MB |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for country, splits in sorted(found.items()):
        for split in sorted(splits, key=_split_order):
            entry = splits[split]
            lines.append(
                f"| {country} | {languages.get(country, '')} | {split} | {entry['rows']} | {entry.get('pseudo_labels', 0)} "
                f"| {entry['files']} | {entry['bytes'] / 1e6:.1f} |"
            )
    stated = [
        (country, split, why)
        for country, reasons in sorted((missing_splits or {}).items())
        if country in found
        for split, why in reasons.items()
    ]
    if stated:
        lines += ["", "Splits a config does not have, and why:", "", "| config | split | why |", "|---|---|---|"]
        lines += [f"| {country} | {split} | {why} |" for country, split, why in stated]
    return "\n".join(lines) + "\n"


def write_dataset_card(
    data_root: DataRoot,
    dataset: str,
    *,
    license: str = "other",
    license_name: str | None = None,
    license_link: str | None = None,
    pretty_name: str | None = None,
) -> str:
    """Write ``hf/<dataset>/README.md``; returns its path in the repo.

    Each country's splits, language, features and missing splits come from the small summary its
    last build stored (:mod:`speechdata.hf.stats`), so no dataset file is opened; a country built
    before summaries were stored is read from its files, once, as before."""
    stored = stored_country_stats(data_root, dataset)
    found: dict[str, dict[str, dict]] = {}
    languages: dict[str, str] = {}
    features: dict[str, list] = {}
    missing: dict[str, dict[str, str]] = {}
    for country, stats in stored.items():
        if not stats["splits"]:
            continue
        found[country] = stats["splits"]
        languages[country] = stats["language"]
        missing[country] = stats["missing_splits"]
        if stats["sample_rate"]:
            features[country] = hf_features(stats["sample_rate"])._to_yaml_list()
    unsummarized = _country_dirs(data_root, dataset) - set(stored)
    if unsummarized:
        old_found, old_languages, old_features = dataset_layout(data_root, dataset, unsummarized)
        found.update(old_found)
        languages.update(old_languages)
        features.update(old_features)
        missing.update(
            {
                country: missing_split_reasons(data_root, dataset, country, set(splits))
                for country, splits in old_found.items()
            }
        )
    card = dataset_card(
        dataset,
        found,
        languages,
        features,
        license=license,
        license_name=license_name,
        license_link=license_link,
        pretty_name=pretty_name,
        missing_splits=missing,
    )
    data_root.write_bytes(layout.hf_dataset_file(dataset, CARD_FILE), card.encode("utf-8"))
    return CARD_FILE


def _country_dirs(data_root: DataRoot, dataset: str) -> set[str]:
    base = data_root.path(layout.hf_dataset_dir(dataset))
    if not data_root.fs.exists(base):
        return set()
    return {
        PurePosixPath(entry["name"]).name
        for entry in data_root.fs.ls(base, detail=True)
        if entry["type"] == "directory" and not PurePosixPath(entry["name"]).name.startswith((".", "_"))
    }
