"""Modification times from a filesystem listing, whichever fsspec backend gave it."""

from __future__ import annotations

from datetime import datetime


def modified_s(info: dict) -> float:
    """A listing entry's modification time in seconds (local: ``mtime``; S3: ``LastModified``)."""
    for key in ("mtime", "LastModified", "last_modified", "updated"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    raise ValueError(f"{info.get('name')}: the filesystem listing gives no modification time")
