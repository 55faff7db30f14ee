"""Each country's small summary for the dataset card, stored beside its state after every build.

``hf/_state/<dataset>/<country>.card.json``: per split the number of files, rows and bytes (from the
state's ``files`` table, which records every file's rows and bytes when it is written), the
country's language and sample rate, and why a promised split is missing. The card
(:mod:`speechdata.hf.card`) is assembled from these files, one per country, so writing it never
opens a dataset file, whatever the size of the dataset.
"""

from __future__ import annotations

import json

from speechdata.hf.missing_splits import missing_split_reasons
from speechdata.hf.state import get_setting, read_state
from speechdata.io import layout
from speechdata.io.storage import DataRoot

STATS_SUFFIX = ".card.json"


def country_stats_path(dataset: str, country: str) -> str:
    return layout.hf_state_database(dataset, country).removesuffix(".duckdb") + STATS_SUFFIX


def country_stats(data_root: DataRoot, dataset: str, country: str) -> dict:
    """``{"splits": {split: {"files", "rows", "pseudo_labels", "bytes"}}, "language", "sample_rate",
    "missing_splits"}`` (``pseudo_labels``: rows whose text is the aligner's, ``text_source`` ``asr``)."""
    with read_state(data_root, layout.hf_state_database(dataset, country)) as db:
        splits = {
            split: {"files": int(files), "rows": int(rows), "pseudo_labels": int(labels), "bytes": int(size)}
            for split, files, rows, labels, size in db.execute(
                "SELECT split, count(*), coalesce(sum(rows), 0), coalesce(sum(pseudo_labels), 0), "
                "coalesce(sum(bytes), 0) FROM files "
                "WHERE split IS NOT NULL AND status <> 'deleted' GROUP BY split ORDER BY split"
            ).fetchall()
        }
        language = get_setting(db, "language")
        rate = get_setting(db, "sample_rate")
    return {
        "splits": splits,
        "language": language or "",
        "sample_rate": int(rate) if rate is not None else None,
        "missing_splits": missing_split_reasons(data_root, dataset, country, set(splits)),
    }


def write_country_stats(data_root: DataRoot, dataset: str, country: str) -> dict:
    stats = country_stats(data_root, dataset, country)
    data_root.write_bytes(
        country_stats_path(dataset, country), json.dumps(stats, sort_keys=True, indent=1).encode("utf-8")
    )
    return stats


def stored_country_stats(data_root: DataRoot, dataset: str) -> dict[str, dict]:
    """``{country: stats}`` of every country whose build stored them."""
    found = {}
    pattern = country_stats_path(dataset, "*")
    for path in sorted(data_root.glob(pattern)):
        country = path.rsplit("/", 1)[-1].removesuffix(STATS_SUFFIX)
        with data_root.fs.open(path, "rb") as handle:
            found[country] = json.loads(handle.read())
    return found
