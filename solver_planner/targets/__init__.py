"""Framework targets: the plans torchtitan, Megatron-LM and DeepSpeed run, and their configs.

One module per framework; :mod:`.base` holds the record they share.
"""

from .base import SCHEDULE_NAMES, TARGETS, TargetConfig

__all__ = ["TargetConfig", "TARGETS", "SCHEDULE_NAMES"]
