"""What a framework runs, as data: the restriction a target puts on the stage search."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rules"]


@dataclass(frozen=True)
class Rules:
    """The schedules (our names), recomputation modes and optimizer-sharding modes a framework
    runs, and whether it lets the first and last pipeline stage hold fewer blocks."""

    schedules: tuple[str, ...]
    recompute: tuple[str, ...]
    sharding: tuple[str, ...]
    first_last_layers: bool = False
