"""The catalog's DuckDB database, through dagster-duckdb's resource."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from dagster_duckdb import DuckDBResource

from resources.settings import ResourceSettings
from speechdata.catalog.views import CATALOG_FILE
from speechdata.io.duckdb_object_store import duckdb_location
from speechdata.io.storage import DataRoot


def catalog_database_path(root_url: str) -> str:
    """The catalog DuckDB file the `catalog` resource opens: the root's own file on a local root; on an
    object store a local working copy (DuckDB writes only local files) that `manifest_catalog` uploads."""
    if DataRoot(root_url).is_local:
        return f"{duckdb_location(root_url).rstrip('/')}/{CATALOG_FILE}"
    digest = hashlib.sha1(root_url.encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / "speechdata-catalog" / digest / CATALOG_FILE)


def catalog_resource(settings: ResourceSettings) -> DuckDBResource:
    return DuckDBResource(database=catalog_database_path(settings.data_root_url))
