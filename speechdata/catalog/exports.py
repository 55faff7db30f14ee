"""Exports of a selection of samples: a WebDataset tar list. Trainer datasets: ``speechdata export``."""

from __future__ import annotations

import pyarrow as pa

from speechdata.bridge.manifest import tar_location


def export_tar_urls(table: pa.Table, root_uri: str, column: str = "tar_url") -> list[str]:
    """The distinct tar URLs of ``table``'s samples under the root at ``root_uri``, sorted (a
    WebDataset shard list). Manifests store ``tar_url`` relative to the root: this resolves it."""
    if column not in table.column_names:
        raise ValueError(f"the table has no {column!r} column")
    return sorted({tar_location(root_uri, url) for url in table.column(column).to_pylist() if url is not None})
