"""Make a held lock look like its holder stopped renewing it (killed, frozen), without waiting out its lease."""

import json
import os
import time

from speechdata.io.storage import DataRoot


def let_lease_lapse(root: DataRoot, relative: str) -> None:
    """Date the lock's heartbeat back past its lease: a local file's modification time, an S3
    object's ``renewed_at``. The holder, if still running in this process, renews again only after
    a sixth of its lease (a minute by default), longer than any test waits."""
    path = root.path(relative)
    if root.is_local:
        with open(path) as handle:
            lease_s = json.load(handle)["lease_s"]
        then = time.time() - 2 * lease_s
        os.utime(path, (then, then))
        return
    holder = json.loads(root.fs.cat_file(path))
    holder["renewed_at"] = time.time() - 2 * holder["lease_s"]
    root.fs.pipe_file(path, json.dumps(holder).encode())
