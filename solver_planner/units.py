"""Readable quantities in, SI numbers out, and back.

Specs accept ``"2 GiB"``, ``"100Gbps"``, ``"270 GB/s"``, ``"5us"``, ``"312 TFLOP/s"``; the
library works in bytes, bytes/s, seconds, FLOP and FLOP/s.  A lower-case ``b`` means bits,
an upper-case ``B`` bytes (``"100Gbps"`` is 12.5e9 bytes/s, ``"100GB/s"`` is 1e11 bytes/s).
Decimal prefixes (k, M, G, T, P, E, Z) are powers of 1000 and binary prefixes (Ki, Mi, Gi,
Ti, Pi, Ei) powers of 1024; durations are also written in ps, ns, us, ms, min or h.  A bare
number is taken in the base unit (bytes, bytes/s, seconds, FLOP).

>>> parse_bytes("2 GiB")
2147483648.0
>>> parse_bandwidth("100Gbps")
12500000000.0
>>> parse_time("5us")
5e-06
>>> format_bytes(8 * 2**30)
'8 GiB'
"""

from __future__ import annotations

import math
import re

from .errors import UnitError

__all__ = [
    "format_count",
    "parse",
    "unit_pattern",
    "describe",
    "parse_bytes",
    "parse_bandwidth",
    "parse_time",
    "parse_flops",
    "parse_flop_rate",
    "format_bytes",
    "format_bandwidth",
    "format_time",
    "format_flops",
    "format_flop_rate",
    "format_rows",
]

_PREFIX = {
    "": 1.0,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}
# (up to the limits below, which are stated in these units: 1 EiB, 1 ZFLOP, 1 EFLOP/s)
_PREFIX_RE = r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|Z)?"
_NUMBER_RE = r"(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)"

# Each kind: regex for the unit part after the prefix, and the factor that unit carries.
_BYTES_UNITS = {"B": 1.0, "byte": 1.0, "bytes": 1.0}
_RATE_UNITS = {
    "B/s": 1.0, "Bps": 1.0, "byte/s": 1.0, "bytes/s": 1.0,
    "b/s": 0.125, "bps": 0.125, "bit/s": 0.125, "bits/s": 0.125,
}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9, "ps": 1e-12,
               "min": 60.0, "h": 3600.0}
_FLOP_UNITS = {"FLOP": 1.0, "FLOPs": 1.0, "flop": 1.0, "flops": 1.0}
_FLOP_RATE_UNITS = {"FLOP/s": 1.0, "FLOPS": 1.0, "flop/s": 1.0}


def _unit_regex(units: dict[str, float], prefixed: bool) -> str:
    unit_alt = "|".join(re.escape(u) for u in sorted(units, key=len, reverse=True))
    prefix = _PREFIX_RE if prefixed else r"(?P<prefix>)"
    return rf"{_NUMBER_RE}\s*(?:{prefix}(?P<unit>{unit_alt}))?"


# kind -> (units, whether SI/binary prefixes apply, noun, example)
_KINDS: dict[str, tuple[dict[str, float], bool, str, str]] = {
    "bytes": (_BYTES_UNITS, True, "a size", "'8 GiB' or '512 MB'"),
    "bandwidth": (_RATE_UNITS, True, "a bandwidth", "'100Gbps' or '270 GB/s'"),
    "time": (_TIME_UNITS, False, "a duration", "'5us' or '1.5 ms'"),
    "flops": (_FLOP_UNITS, True, "a FLOP count", "'1.2 TFLOP'"),
    "flop_rate": (_FLOP_RATE_UNITS, True, "a compute rate", "'312 TFLOP/s'"),
}


# The magnitudes a quantity may have (zero aside): far beyond any real device or link, so
# that nothing downstream overflows or divides by a denormal. README, "Units".
LIMITS: dict[str, tuple[float, float, str]] = {
    "bytes": (1.0, 2.0**60, "1 B to 1 EiB"),
    "bandwidth": (1.0, 1e15, "1 B/s to 1 PB/s"),
    "time": (1e-12, 3600.0, "1 ps to 1 hour"),
    "flops": (1.0, 1e21, "1 FLOP to 1 ZFLOP"),
    "flop_rate": (1.0, 1e18, "1 FLOP/s to 1 EFLOP/s"),
}


def unit_pattern(kind: str) -> str:
    """The regular expression (for JSON Schema) of the strings :func:`parse` accepts for ``kind``."""
    units, prefixed, _, _ = _KINDS[kind]
    # JSON Schema patterns have no named groups.
    return "^" + re.sub(r"\(\?P<[a-z]+>", "(", _unit_regex(units, prefixed)) + "$"


def describe(kind: str) -> str:
    """``'a size such as '8 GiB' or '512 MB''``: what a field of this kind expects."""
    _, _, noun, example = _KINDS[kind]
    return f"{noun} such as {example}"


def parse(value: object, kind: str) -> float:
    """Read a quantity of ``kind`` (bytes, bandwidth, time, flops, flop_rate) as an SI float."""
    units, prefixed, noun, example = _KINDS[kind]
    if isinstance(value, bool):
        raise UnitError(f"expected {noun} such as {example}, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            number = math.inf
    elif isinstance(value, str):
        match = re.fullmatch(_unit_regex(units, prefixed), value.strip())
        if match is None or (match.group("prefix") and not match.group("unit")):
            raise UnitError(f"expected {noun} such as {example}, got {value!r}")
        scale = _PREFIX[match.group("prefix") or ""] if match.group("unit") else 1.0
        factor = scale * (units[match.group("unit")] if match.group("unit") else 1.0)
        # Divide by an exact integer for sub-unit factors: 5 * 1e-6 != 5e-6 in binary floats.
        num = float(match.group("num"))
        number = num * factor if factor >= 1 else num / round(1 / factor)
    else:
        raise UnitError(f"expected {noun} such as {example}, got {type(value).__name__} {value!r}")
    if math.isnan(number):
        raise UnitError(f"expected {noun} such as {example}, got {_short(value)}")
    if number < 0 or math.copysign(1.0, number) < 0:
        raise UnitError(f"expected a non-negative {noun.split(' ', 1)[1]}, got {_short(value)}")
    low, high, text = LIMITS[kind]
    if number != 0 and not low <= number <= high:
        raise UnitError(f"{noun} out of range: expected 0 or {text}, got {_short(value)}")
    return number


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_bytes(value: object) -> float:
    """Bytes from ``"8 GiB"``, ``"1.5 GB"``, ``"512 MiB"`` or a plain number of bytes."""
    return parse(value, "bytes")


def parse_bandwidth(value: object) -> float:
    """Bytes per second from ``"100Gbps"``, ``"10 Gb/s"``, ``"270 GB/s"`` or a number."""
    return parse(value, "bandwidth")


def parse_time(value: object) -> float:
    """Seconds from ``"5us"``, ``"1.5 ms"``, ``"2 s"`` or a number of seconds."""
    return parse(value, "time")


def parse_flops(value: object) -> float:
    """A FLOP count from ``"1.2 TFLOP"`` or a number."""
    return parse(value, "flops")


def parse_flop_rate(value: object) -> float:
    """FLOP/s from ``"312 TFLOP/s"``, ``"312 TFLOPS"`` or a number."""
    return parse(value, "flop_rate")


def _scaled(value: float, steps: list[tuple[float, str]], digits: int = 3) -> str:
    """``value`` in the largest unit of ``steps`` it is at least one of, once rounded to
    ``digits``: 0.9996 s is ``1 s``, not ``1e+03 ms``.

    >>> format_time(0.9996), format_time(0.0009996), format_time(2.34375e8), format_bytes(1023.9)
    ('1 s', '1 ms', '2.34e+08 s', '1 KiB')
    """
    for factor, name in steps:
        if abs(float(f"{value / factor:.{digits}g}")) >= 1:
            return f"{_round(value / factor, digits)} {name}"
    factor, name = steps[-1]
    return f"{_round(value / factor, digits)} {name}"


def _round(x: float, digits: int) -> str:
    # whole numbers in full up to six digits; beyond, in the exponent form the rest of the
    # row uses (234375000 s beside 2.34e+08 s read as two different numbers)
    if x == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.{digits}g}"


def format_bytes(n: float) -> str:
    """``8589934592`` -> ``'8 GiB'`` (binary prefixes, as memory sizes are usually quoted)."""
    steps = [(2.0**60, "EiB"), (2.0**50, "PiB"), (2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")]
    return _scaled(n, steps)


def format_bandwidth(bps: float) -> str:
    """``8e9`` -> ``'8 GB/s'`` (decimal prefixes, as link speeds are quoted)."""
    steps = [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")]
    return _scaled(bps, steps)


def format_time(seconds: float) -> str:
    """``0.00125`` -> ``'1.25 ms'``."""
    if seconds == 0:
        return "0 s"
    steps = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]
    return _scaled(seconds, steps)


def format_flops(n: float) -> str:
    """``1.2e12`` -> ``'1.2 TFLOP'``."""
    steps = [(1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1.0, "FLOP")]
    return _scaled(n, steps)


def format_flop_rate(n: float) -> str:
    """``3.12e14`` -> ``'312 TFLOP/s'``."""
    return format_flops(n) + "/s"


def format_count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one (English's ``-es`` after a sibilant).

    >>> format_count(1, "stage"), format_count(4, "stage"), format_count(1, "micro-batch"), format_count(2, "micro-batch")
    ('1 stage', '4 stages', '1 micro-batch', '2 micro-batches')
    """
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}{'es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's'}"


def format_span(first: int, last: int, names: tuple[str, str] | None = None) -> str:
    """``first-last`` (one number when they are equal), with the names of the two ends.

    >>> format_span(0, 3, ("embed", "block")), format_span(11, 11, ("block", "block")), format_span(4, 4)
    ('0-3 (embed..block)', '11 (block)', '4')
    """
    text = f"{first}" if first == last else f"{first}-{last}"
    if names is None:
        return text
    return f"{text} ({names[0]})" if first == last else f"{text} ({names[0]}..{names[1]})"


def format_rows(rows: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``[0-2,5]``: runs of consecutive chunks shortened.

    >>> format_rows((0, 1, 2, 5))
    '[0-2,5]'
    >>> format_rows(())
    '[]'
    """
    parts, i = [], 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        parts.append(str(rows[i]) if i == j else f"{rows[i]}-{rows[j]}")
        i = j + 1
    return "[" + ",".join(parts) + "]"


def format_meshes(mesh: list) -> str:
    """``2x4``, or each stage's shape when they differ (runs of one shape as ``1x8 x3``)."""
    if not mesh or not isinstance(mesh[0], list):
        return "x".join(map(str, mesh))
    out: list[list] = []
    for m in mesh:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return " ".join("x".join(map(str, m)) + (f" x{n}" if n > 1 else "") for m, n in out)
