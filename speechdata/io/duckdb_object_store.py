"""DuckDB over a data root on object storage: reading its parquet files, keeping database files there.

Reads: DuckDB's own ``httpfs`` extension when it is installed (the production image installs it at
build time: ``deploy/Dockerfile``), with an S3 secret made from the same ``AWS_*`` environment
variables s3fs reads; otherwise the data root's own fsspec filesystem is registered with the
connection (``DuckDBPyConnection.register_filesystem``), which needs no download and is what runs
offline and in the tests. Both read ``s3://bucket/prefix/...`` globs with the same SQL.

Database files: DuckDB writes only to local files, so a database that lives under an object-store
root (``catalog.duckdb``, the publishing state) is worked on as a local copy and put back whole,
through the data root's atomic write, when the work succeeds.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from urllib.parse import urlparse

import duckdb

from speechdata.io.storage import DataRoot, _is_local, escape_glob, filesystem_for

S3_PROTOCOLS = ("s3", "s3a")


def enable_data_root_reads(
    connection: duckdb.DuckDBPyConnection, data_root: DataRoot, *, environ: Mapping[str, str] | None = None
) -> str:
    """Let ``connection`` read files under ``data_root``; returns how: ``local``, ``httpfs`` or ``fsspec``.

    The catalog's views name files relative to the root (so that a root can move) and read the
    root's location from the ``speechdata_root`` variable set here; relative file names in ad-hoc
    queries resolve against it too (``file_search_path``, local roots).
    """
    location = data_root.root if data_root.is_local else data_root.fs.unstrip_protocol(data_root.root)
    # Escaped: the views glob under it, and a root such as /data/run[1] must match itself.
    connection.execute("SET VARIABLE speechdata_root = ?", [escape_glob(location)])
    connection.execute(f"SET file_search_path = {_literal(location)}")
    if data_root.is_local:
        return "local"
    if data_root.protocol in S3_PROTOCOLS and _load_installed_httpfs(connection):
        connection.execute(s3_secret_sql(os.environ if environ is None else environ))
        return "httpfs"
    # Without httpfs, DuckDB would try to download it for an s3:// path before asking fsspec.
    connection.execute("SET autoinstall_known_extensions = false")
    connection.register_filesystem(data_root.fs)
    return "fsspec"


def _load_installed_httpfs(connection: duckdb.DuckDBPyConnection) -> bool:
    """``LOAD`` only: an ``INSTALL`` reaches DuckDB's extension site, which a pod may not be allowed to."""
    try:
        connection.execute("LOAD httpfs")
    except duckdb.Error:
        return False
    return True


def s3_secret_sql(environ: Mapping[str, str]) -> str:
    """``CREATE SECRET`` for httpfs from the standard AWS variables (what s3fs and boto read).

    Without an access key in the environment the secret defers to the AWS credential chain
    (instance profile, IRSA web identity), which is what a Kubernetes pod normally has.
    """
    options = ["TYPE s3"]
    key_id = environ.get("AWS_ACCESS_KEY_ID")
    if key_id:
        options += [f"KEY_ID {_literal(key_id)}", f"SECRET {_literal(environ.get('AWS_SECRET_ACCESS_KEY', ''))}"]
        if environ.get("AWS_SESSION_TOKEN"):
            options.append(f"SESSION_TOKEN {_literal(environ['AWS_SESSION_TOKEN'])}")
    else:
        options.append("PROVIDER credential_chain")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        options.append(f"REGION {_literal(region)}")
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        # A custom endpoint (MinIO, Ceph, a local test server) serves path-style URLs.
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options += [
            f"ENDPOINT {_literal(parsed.netloc)}",
            "URL_STYLE 'path'",
            f"USE_SSL {'true' if parsed.scheme == 'https' else 'false'}",
        ]
    return f"CREATE OR REPLACE SECRET speechdata_data_root ({', '.join(options)})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@contextlib.contextmanager
def database_on_root(data_root: DataRoot, relative: str, *, read_only: bool = False) -> Iterator[str]:
    """A local path for the DuckDB database at ``relative`` under ``data_root``.

    A local root gives the file itself. An object-store root gives a temporary copy (empty when the
    database does not exist yet); unless ``read_only``, the copy replaces the stored database
    atomically when the block ends without error, so a failed run leaves the previous version.
    """
    if data_root.is_local:
        path = data_root.path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="speechdata-duckdb-") as scratch:
        local = os.path.join(scratch, os.path.basename(relative))
        if data_root.exists(relative):
            data_root.fs.get(data_root.path(relative), local)
        yield local
        if not read_only:
            upload_database(data_root, local, relative)


def upload_database(data_root: DataRoot, local_path: str, relative: str) -> None:
    """Put a closed (checkpointed) local DuckDB file at ``relative`` under the root, atomically."""
    with open(local_path, "rb") as source, data_root.open_atomic(relative) as target:
        while chunk := source.read(16 * 2**20):
            target.write(chunk)


__all__ = ["database_on_root", "enable_data_root_reads", "s3_secret_sql", "upload_database"]


def duckdb_location(root_uri: str) -> str:
    """How DuckDB names the root: a plain absolute path for a local root, the URL otherwise."""
    fs, root = filesystem_for(root_uri)
    return root if _is_local(fs) else fs.unstrip_protocol(root)
