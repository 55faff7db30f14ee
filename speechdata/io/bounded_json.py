"""Decode JSON a user landed (segmentations, aligned-JSON corpora, language indexes) within bounds.

``json.loads`` recurses once per nesting level: a file of 100 000 ``[`` raises ``RecursionError``
(not a ``ValueError``), which escapes every per-file handler and fails the whole step. A file of a
few gigabytes is read whole before it is parsed. Every landed or user JSON goes through
:func:`load_bounded_json` (or :func:`read_bounded_json_bytes` for a file), which refuses a document
larger than :data:`MAX_JSON_BYTES` before decoding it and one nested deeper than the parser can go
(Python's recursion limit, about 1000 levels; no landed format needs more than 4) with a
:class:`JsonBoundsError` (a ``ValueError``) naming the file, the depth and the limit, so the caller
records one reject or one error for that file alone.

The depth is the parser's own limit, not a scan before parsing: a scan of every byte for brackets
outside strings cost four times the parse itself on a 6 MB aligned JSON.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from typing import Any

MAX_JSON_BYTES = 256 << 20
"""256 MiB: an aligned-JSON transcript of a day of speech is a few megabytes."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonBoundsError(ValueError):
    """A JSON document over a bound: ``source`` names the file, ``limit`` which bound."""

    def __init__(self, source: str, limit: str, detail: str):
        self.source, self.limit, self.detail = source, limit, detail
        super().__init__(f"{source}: {detail}")


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in ``data`` (brackets inside strings do not count)."""
    brackets = _BRACKET.findall(_STRING.sub(b'""', data))
    if not brackets:
        return 0
    return max(itertools.accumulate(_DEPTH_STEP[b[0]] for b in brackets))


def load_bounded_json(data: bytes | str, source: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """``json.loads(data)`` within the bounds. Decoding errors are ``json``'s own (``JSONDecodeError``,
    ``UnicodeDecodeError``); a bound exceeded is :class:`JsonBoundsError`."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise JsonBoundsError(source, "size", f"JSON of {size} bytes is over the {max_bytes}-byte limit")
    try:
        return json.loads(data)
    except RecursionError:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        raise JsonBoundsError(
            source,
            "depth",
            f"JSON nested {json_depth(raw)} levels deep, deeper than the parser goes "
            f"(Python's recursion limit, {sys.getrecursionlimit()})",
        ) from None


def read_bounded_json_bytes(handle, source: str, *, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """At most ``max_bytes`` of an open binary file: a larger file is refused before it is read whole."""
    data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JsonBoundsError(source, "size", f"JSON file over the {max_bytes}-byte limit")
    return data
