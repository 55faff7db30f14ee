"""Read-only means read-only: a catalog connection for people's SQL can neither write a file nor read
one outside the data root's catalogued folders, whatever statement it is given.

DuckDB's ``read_only`` connection protects the database file only: ``COPY ... TO '/anywhere'`` and
``read_text('/etc/passwd')`` still run, and its ``allowed_directories`` lets a statement *write*
under the listed folders as much as read (``EXPLAIN ANALYZE COPY ... TO '<root>/manifests/x'``
runs the COPY: a statement filter alone is one parser quirk away from forged manifests, rejects
and ``_SUCCESS`` markers). So the protection is structural:

* the database is opened ``read_only``;
* the views read the root through :class:`ReadOnlyDataRoot`, an fsspec filesystem registered under
  its own protocol (``speechdata-catalog://data-root/<folder>/...``) that serves the catalogued
  folders of one data root and has no way to write: every mutating call raises ``PermissionError``;
* the only allowed directories are that filesystem's folders (``allowed_directories``), external
  access is otherwise off (plain paths, extensions, secrets, ``INSTALL``) and the configuration is
  locked, so no statement can turn any of it back.

The statement check (:func:`check_query_only`) stays in front for a clear message; nothing relies on it.
"""

from __future__ import annotations

import os

import duckdb
from fsspec import AbstractFileSystem

from speechdata.bridge.manifest import MANIFESTS_DIR
from speechdata.io import layout
from speechdata.io.storage import DataRoot, escape_glob

READABLE_FOLDERS = (MANIFESTS_DIR, layout.SHARDS, layout.LANDING, layout.TRANSLATION, layout.ASR)
"""What the catalog's views read, relative to the data root."""

READ_ONLY_PROTOCOL = "speechdata-catalog"
VIRTUAL_ROOT = "data-root"
READ_ONLY_ROOT_URL = f"{READ_ONLY_PROTOCOL}://{VIRTUAL_ROOT}"
"""Where a locked-down connection's views find the data root (its ``speechdata_root`` variable)."""

_QUERY_TYPES = {"SELECT", "EXPLAIN"}


class ReadOnlyDataRoot(AbstractFileSystem):
    """The catalogued folders of one data root, readable and nothing else.

    Paths are ``speechdata-catalog://data-root/<folder>/<rest>``; ``<folder>`` must be one of
    :data:`READABLE_FOLDERS`. On a local root a path that resolves (symlinks, ``..``) outside its
    folder is refused as well.
    """

    protocol = (READ_ONLY_PROTOCOL,)
    cachable = False
    root_marker = ""

    def __init__(self, data_root: DataRoot):
        super().__init__()
        self.data_root = data_root
        self.target = data_root.fs
        self._base = data_root.root.rstrip("/")

    def _real(self, path: str) -> str:
        relative = self._relative(path)
        real = f"{self._base}/{relative}"
        if self.data_root.is_local:
            folder = os.path.realpath(f"{self._base}/{relative.split('/', 1)[0]}")
            resolved = os.path.realpath(real)
            if resolved != folder and not resolved.startswith(folder + os.sep):
                raise PermissionError(f"read-only catalog: {path} resolves outside {folder}")
        return real

    def _relative(self, path: str) -> str:
        stripped = self._strip_protocol(path)
        prefix = VIRTUAL_ROOT + "/"
        relative = stripped[len(prefix) :] if stripped.startswith(prefix) else None
        if relative is None or relative.split("/", 1)[0] not in READABLE_FOLDERS:
            raise PermissionError(f"read-only catalog: {path} is outside the catalogued folders {READABLE_FOLDERS}")
        return relative

    def _virtual(self, real: str) -> str:
        real = self.target._strip_protocol(real)
        if not real.startswith(self._base + "/"):
            raise PermissionError(f"read-only catalog: {real} is outside the data root {self._base}")
        return f"{VIRTUAL_ROOT}/{real[len(self._base) + 1 :]}"

    def _virtual_info(self, info: dict) -> dict:
        return {**info, "name": self._virtual(info["name"])}

    def _open(self, path, mode="rb", **kwargs):
        if mode != "rb":
            raise PermissionError(f"read-only catalog: cannot open {path} for writing (mode {mode!r})")
        return self.target.open(self._real(path), "rb")

    def open(self, path, mode="rb", **kwargs):
        if "r" not in mode or "+" in mode:
            raise PermissionError(f"read-only catalog: cannot open {path} for writing (mode {mode!r})")
        return super().open(path, mode, **kwargs)

    def ls(self, path, detail=True, **kwargs):
        entries = self.target.ls(self._real(path), detail=True)
        entries = [self._virtual_info(e) for e in entries]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        return self._virtual_info(self.target.info(self._real(path)))

    def modified(self, path):
        return self.target.modified(self._real(path))

    def glob(self, path, maxdepth=None, **kwargs):
        relative = self._relative(path)
        found = self.target.glob(f"{escape_glob(self._base)}/{relative}", maxdepth=maxdepth)
        return [self._virtual(p) for p in found if self._readable(p)]

    def _readable(self, real: str) -> bool:
        try:
            self._real(self._virtual(real))
        except PermissionError:
            return False
        return True

    def _refuse(self, *args, **kwargs):
        raise PermissionError("read-only catalog: the data root cannot be changed from here")

    mkdir = makedirs = rm = rm_file = _rm = rmdir = mv = copy = cp_file = put = put_file = _refuse
    pipe = pipe_file = touch = write_bytes = write_text = _refuse


def lock_down(connection: duckdb.DuckDBPyConnection, root: DataRoot) -> None:
    """Read the root through :class:`ReadOnlyDataRoot` only, then lock the configuration."""
    connection.register_filesystem(ReadOnlyDataRoot(root))
    connection.execute("SET VARIABLE speechdata_root = ?", [READ_ONLY_ROOT_URL])
    allowed = ", ".join(f"'{READ_ONLY_ROOT_URL}/{folder}/'" for folder in READABLE_FOLDERS)
    connection.execute(f"SET allowed_directories = [{allowed}]")
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def check_query_only(connection: duckdb.DuckDBPyConnection, sql: str) -> None:
    """ValueError naming the statement when ``sql`` holds anything but queries (COPY, ATTACH, SET...).

    A courtesy: the refusal names the statement before DuckDB runs anything. What makes the
    connection read-only is :func:`lock_down`, which holds for the statements this lets through.
    """
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error:
        return  # a syntax error: running it reports DuckDB's own message
    for statement in statements:
        kind = statement.type.name.upper()
        if kind not in _QUERY_TYPES:
            raise ValueError(f"read-only catalog: only queries (SELECT, EXPLAIN) run here, refused a {kind} statement")
