"""Seeded random faults for the fake platforms: a share of one method's calls fails,
each in a way drawn from a list, reproducibly (the same seed fails the same calls)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class _Rule:
    rate: float
    kinds: tuple[str, ...]
    rng: random.Random
    hang_s: float


class Chaos:
    """Per-method rules; ``draw(method)`` says which fault (if any) the next call gets."""

    def __init__(self, known: tuple[str, ...]) -> None:
        self.known = known
        self._rules: dict[str, _Rule] = {}

    def set(self, method: str, rate: float, kinds: tuple[str, ...], seed: int, hang_s: float) -> None:
        unknown = set(kinds) - set(self.known)
        if unknown:
            raise ValueError(f"unknown chaos kinds: {sorted(unknown)}")
        self._rules[method] = _Rule(rate, kinds, random.Random(seed), hang_s)

    def clear(self, method: str | None = None) -> None:
        if method is None:
            self._rules.clear()
        else:
            self._rules.pop(method, None)

    def draw(self, method: str) -> tuple[str, float] | None:
        """``(kind, hang_s)`` for a failing call, None for one that goes through."""
        rule = self._rules.get(method)
        if rule is None or rule.rng.random() >= rule.rate:
            return None
        return rule.rng.choice(rule.kinds), rule.hang_s
