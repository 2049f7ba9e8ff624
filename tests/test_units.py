import math

import pytest

from solver_planner.errors import UnitError
from solver_planner import units


@pytest.mark.parametrize("text, expected", [
    ("2 GiB", 2 * 2**30), ("8GiB", 8 * 2**30), ("1.5 GB", 1.5e9), ("512 MiB", 512 * 2**20),
    ("100 KB", 1e5), ("1 KiB", 1024), (1024, 1024), ("4096", 4096), ("1e3 B", 1000), ("3 bytes", 3),
])
def test_bytes(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("100Gbps", 12.5e9), ("100 Gb/s", 12.5e9), ("10 Gbps", 1.25e9), ("270 GB/s", 270e9),
    ("8GB/s", 8e9), ("400 Gbit/s", 50e9), ("1 GiB/s", 2**30), (5e9, 5e9), ("32 GBps", 32e9),
])
def test_bandwidth_bits_and_bytes(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("5us", 5e-6), ("5 µs", 5e-6), ("1.5 ms", 1.5e-3), ("2 s", 2.0), ("10ns", 1e-8), (0.25, 0.25), ("0", 0.0),
])
def test_time_is_exact(text, expected):
    assert units.parse_time(text) == expected


def test_flops():
    assert units.parse_flop_rate("312 TFLOP/s") == 312e12
    assert units.parse_flop_rate("989 TFLOPS") == 989e12
    assert units.parse_flops("1.2 TFLOP") == 1.2e12


@pytest.mark.parametrize("parse, bad", [
    (units.parse_bytes, "lots"), (units.parse_bytes, "5 GB/s"), (units.parse_bytes, "-1"), (units.parse_bytes, "G"),
    (units.parse_bandwidth, "8 GB"), (units.parse_bandwidth, "fast"), (units.parse_time, "5 GB"),
    (units.parse_time, "5 ks"), (units.parse_bytes, True), (units.parse_bytes, None), (units.parse_bytes, [1]),
    (units.parse_bytes, "1e999"), (units.parse_time, -1),
])
def test_bad_units_are_refused_with_an_example(parse, bad):
    with pytest.raises(UnitError, match="such as|non-negative|out of range"):
        parse(bad)


def test_patterns_accept_exactly_what_the_parser_accepts():
    import re
    for kind, good, bad in [("bytes", "8 GiB", "8 GiB/s"), ("bandwidth", "100Gbps", "100 G"), ("time", "5us", "5 Gus")]:
        pattern = units.unit_pattern(kind)
        assert re.match(pattern, good)
        assert not re.match(pattern, bad)
        units.parse(good, kind)
        with pytest.raises(UnitError):
            units.parse(bad, kind)


@pytest.mark.parametrize("value, fmt, expected", [
    (8 * 2**30, units.format_bytes, "8 GiB"), (1536, units.format_bytes, "1.5 KiB"),
    (8e9, units.format_bandwidth, "8 GB/s"), (12.5e9, units.format_bandwidth, "12.5 GB/s"),
    (0.00125, units.format_time, "1.25 ms"), (2.0, units.format_time, "2 s"), (0, units.format_time, "0 s"),
    (312e12, units.format_flop_rate, "312 TFLOP/s"),
])
def test_format(value, fmt, expected):
    assert fmt(value) == expected


def test_round_trip():
    for v in [1, 1000, 2**20, 3.5e9, 2**40]:
        assert math.isclose(units.parse_bytes(units.format_bytes(v)), v, rel_tol=1e-2)


def test_every_bound_is_writable_in_the_units_it_is_stated_in():
    """The limits read '1 B to 1 EiB', '1 ps to 1 hour', '1 ZFLOP', '1 EFLOP/s', but EiB, ps,
    h, ZFLOP and EFLOP/s were refused as not a size, duration or rate."""
    from solver_planner import units

    assert units.parse_bytes("1 EiB") == 2.0**60 and units.parse_bytes("1EB") == 1e18
    assert units.parse_time("1 ps") == 1e-12 and units.parse_time("1 h") == 3600 and units.parse_time("2 min") == 120
    assert units.parse_flops("1 ZFLOP") == 1e21 and units.parse_flop_rate("1 EFLOP/s") == 1e18
    assert units.parse_bytes("1E18 B") == 1e18 and units.parse_bytes("1e18") == 1e18      # exponents still read
    for text, parse in (("2 EiB", units.parse_bytes), ("2 h", units.parse_time), ("2 ZFLOP", units.parse_flops)):
        with pytest.raises(units.UnitError, match="out of range"):
            parse(text)
    assert units.format_bytes(2.0**60) == "1 EiB"
