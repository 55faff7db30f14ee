"""Let WebDataset stream tars from object storage through fsspec, as the data root does.

WebDataset opens URLs with its own ``gopen`` table, which has no ``s3://`` entry (and reads
``gs://`` through the ``gsutil`` command). Registering fsspec for the object-store schemes means a
tar URL from a manifest (``s3://bucket/prefix/bridge/<shard>-000000.tar``) streams with the same
credentials and endpoint (``AWS_*`` environment variables) as every other read of the data root.
"""

from __future__ import annotations

import sys

OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


def gopen_fsspec(url: str, mode: str = "rb", bufsize: int = 8192, **_):
    """WebDataset's handler signature: an open binary stream of ``url``, read front to back."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    # Tars are read front to back: large blocks mean few requests.
    return fs.open(path, mode, block_size=max(bufsize, 8 * 2**20))


def register_fsspec_schemes() -> None:
    """Point WebDataset's ``gopen`` at fsspec for :data:`OBJECT_STORE_SCHEMES` (idempotent)."""
    from webdataset.gopen import gopen_schemes  # the module: ``webdataset.gopen`` the name is its function

    for scheme in OBJECT_STORE_SCHEMES:
        gopen_schemes[scheme] = gopen_fsspec


def register_if_webdataset_loaded() -> None:
    """At import of a reader module: a DataLoader worker started with ``spawn`` unpickles the
    pipeline (importing webdataset) before the reader's functions, so the table is fixed there too."""
    if "webdataset" in sys.modules:
        register_fsspec_schemes()
