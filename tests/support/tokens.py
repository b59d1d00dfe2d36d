"""Deterministic token ids for prompts and the comparisons the reuse tests make on them."""

from __future__ import annotations


def ids(seed: int, n: int) -> list[int]:
    """``n`` token ids from ``seed`` (the same in every process; within a tiny model's vocabulary)."""
    return [5 + (seed * 131 + i * 37) % 500 for i in range(n)]


def first_difference(a: list, b: list) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length if none)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
