"""Batches for GPU models: length-sorted, budgeted, and split in half on CUDA out-of-memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class ItemTooLarge(RuntimeError):
    """A single item does not fit on the device even alone."""


def budgeted_batches(costs: Sequence[int], max_padded_cost: int, max_items: int = 256) -> list[list[int]]:
    """Indices sorted by cost, grouped so that ``len(batch) * max(cost) <= max_padded_cost``."""
    order = sorted(range(len(costs)), key=lambda i: costs[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (costs[i] * (len(current) + 1) > max_padded_cost or len(current) >= max_items):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def run_splitting_on_oom(
    batch: list[Item], forward: Callable[[list[Item]], list[Result]], on_split: Callable[[int], None] | None = None
) -> list[Result]:
    """``forward(batch)``; on CUDA out-of-memory, free the cache and retry each half, down to one item."""
    import torch  # here, not at module level: the code location imports ItemTooLarge without torch

    try:
        return forward(batch)
    except torch.cuda.OutOfMemoryError as exc:
        if len(batch) == 1:
            raise ItemTooLarge(str(exc)) from exc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if on_split:
        on_split(len(batch))
    middle = len(batch) // 2
    return run_splitting_on_oom(batch[:middle], forward, on_split) + run_splitting_on_oom(
        batch[middle:], forward, on_split
    )
