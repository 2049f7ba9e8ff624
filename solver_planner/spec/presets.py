"""Device presets: datasheet peaks and a microbenchmarked compute block per accelerator.

The presets are data (``solver_planner/data/devices.yaml``, each number with its source),
not constants in code.  A cluster spec names one with ``device: {preset: A100-SXM4-80GB}``;
every key the spec writes itself overrides the preset's, key by key inside ``compute`` and
``dtype_flops`` too, so ``device: {preset: H100-SXM5-80GB, memory: 94 GB}`` is an H100 with
more memory.  :func:`apply_preset` records which keys the preset filled in, for ``show``.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..errors import closest

__all__ = ["PRESETS_FILE", "presets", "preset_names", "apply_preset", "MERGED_KEYS"]

PRESETS_FILE = Path(__file__).resolve().parent.parent / "data" / "devices.yaml"
MERGED_KEYS = ("compute", "dtype_flops")      # mappings merged key by key, not replaced whole


@lru_cache(maxsize=1)
def presets() -> dict[str, dict[str, Any]]:
    """Every preset by name (the data file, read once)."""
    # our own data file: libyaml's safe loader when present (the pure-Python one takes a
    # tenth of a second, a tenth of what `reduce verify` may take in all)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(PRESETS_FILE, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def preset_names() -> list[str]:
    return sorted(presets())


def apply_preset(data: Any, source) -> list[str]:
    """Fill ``data['device']`` (a cluster spec's raw mapping, changed in place) from its
    ``preset``; returns the keys the preset filled in (``compute.memory_efficiency`` style for
    merged mappings).  An unknown name is a spec error at ``device.preset`` with the closest
    names."""
    if not isinstance(data, dict) or not isinstance(data.get("device"), dict):
        return []
    device = data["device"]
    name = device.get("preset")
    if name is None:
        return []
    table = presets()
    if not isinstance(name, str) or name not in table:
        close = closest(name, table, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise source.error(("device", "preset"), f"no device preset named {name!r}{hint} (presets:"
                           f" {', '.join(preset_names())})")
    filled = []
    for key, value in table[name].items():
        if key not in device:
            device[key] = copy.deepcopy(value)
            filled.append(key)
        elif key in MERGED_KEYS and isinstance(device[key], dict) and isinstance(value, dict):
            for sub, v in value.items():
                if sub not in device[key]:
                    device[key][sub] = copy.deepcopy(v)
                    filled.append(f"{key}.{sub}")
    return filled
