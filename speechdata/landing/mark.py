"""Mark a landing shard complete: ``_SUCCESS`` is written last, after every other file of the shard.

The landing sensor ignores a shard until its marker exists (docs/landing-contract.md), so every
producer (importers, sample data, the ``speechdata land`` command) finishes with this call.
"""

from __future__ import annotations

import datetime
import uuid

from speechdata.io import layout
from speechdata.io.storage import DataRoot, remove_temps_under


def mark_landed(data_root: DataRoot, shard_id: str) -> None:
    """Write ``_SUCCESS``: the shard is complete and the landing sensor may pick it up.

    The marker holds a fresh landing id: its bytes are part of the shard's content fingerprint, so
    marking a shard landed again asks for a re-run even when no other file changed.

    Every file of the shard is written by now, so a ``._tmp-*`` file left in its folder is a killed
    import's (a half-copied ``audio.tar`` can be gigabytes): removed first, so no importer's crash
    outlives its next import."""
    remove_temps_under(data_root.fs, data_root.path(layout.landing_dir(shard_id)))
    landing_id = f"landing {uuid.uuid4().hex} {datetime.datetime.now(datetime.UTC).isoformat()}\n"
    data_root.write_bytes(layout.landing_success_marker(shard_id), landing_id.encode())
