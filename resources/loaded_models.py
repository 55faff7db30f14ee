"""Models loaded once per process, whatever resource instance or run asks for them."""

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_LOADED: dict[tuple, object] = {}
_LOCK = threading.Lock()


def load_once(key: tuple, build: Callable[[], T]) -> T:
    """``build()`` the first time ``key`` (model identity, device, dtype, ...) is asked for; the same object after."""
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = build()
        return _LOADED[key]
