"""Meshes, sharding specs, tiles and unit tasks (the resharding paper §2.2), and the strategies of §3.1."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CLUSTERS
from solver_planner.cost import CostModel
from solver_planner.resharding import DimTiling, Layout, ReshardingProblem, ShardingSpec, unit_cost
from solver_planner.topology import load_topology

P3X5 = load_topology(CLUSTERS / "aws-p3.8xlarge-5.yaml")
ETH = 10e9 / 8  # bytes/s of the p3 hosts' network


def test_tiles_pad_the_last_one():
    t = DimTiling(1024, 3)
    assert (t.tile, t.padding) == (342, 2)
    assert [t.interval(k) for k in range(3)] == [(0, 342), (342, 684), (684, 1024)]
    # More tiles than elements: the last tiles hold only padding (empty intervals).
    t = DimTiling(3, 4)
    assert [t.interval(k) for k in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 3)]


def test_s01_is_row_major_over_the_mesh():
    p = ReshardingProblem.build("t", (8, 2), "float32", P3X5, ([0, 1], 4, "S01,R"), ([2], 1, "R,R"))
    boxes = {d: p.src.box_of(i, j) for i, row in enumerate(p.src.mesh.devices) for j, d in enumerate(row)}
    # Device (i, j) holds tile i * 4 + j of dimension 0.
    assert boxes[0] == ((0, 1), (0, 2)) and boxes[3] == ((3, 4), (0, 2)) and boxes[4] == ((4, 5), (0, 2))
    assert boxes[7] == ((7, 8), (0, 2))


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="mesh axis"):
        ShardingSpec.parse("S0,S01")
    with pytest.raises(ValueError, match="one of"):
        ShardingSpec.parse("S2,R")
    with pytest.raises(ValueError, match="rank"):
        ReshardingProblem.build("t", (8, 8), "float32", P3X5, ([0], 4, "S0"), ([1], 4, "R,R"))
    with pytest.raises(ValueError, match="share devices"):
        ReshardingProblem.build("t", (8,), "float32", P3X5, ([0, 1], 4, "S0"), ([1, 2], 4, "R"))


def test_the_2x4_to_2x4_dim0_to_dim1_case_has_64_unit_tasks():
    # The resharding paper §5.1.2: "case 4 which has 64 unit communication tasks".
    p = ReshardingProblem.build("t", (1024, 1024, 512), "float16", P3X5, ([0, 1], 4, "S01,R,R"),
                                ([2, 3], 4, "R,S01,R"))
    tasks = p.unit_tasks()
    assert len(tasks) == 64
    assert sum(t.nbytes for t in tasks) == p.nbytes == 2 ** 30
    assert all(len(t.holders) == 1 and len(t.receivers) == 1 for t in tasks)


SPEC = st.sampled_from(["R", "S0", "S1", "S01"])


@st.composite
def problems(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    specs = []
    for _ in range(2):
        entries = draw(st.lists(SPEC, min_size=rank, max_size=rank))
        used: set[str] = set()
        for d, e in enumerate(entries):  # drop reused mesh axes
            if set(e[1:]) & used:
                entries[d] = "R"
            used |= set(entries[d][1:])
        specs.append(",".join(entries))
    src_hosts = draw(st.integers(1, 2))
    dst_hosts = draw(st.integers(1, 3))
    src = (list(range(src_hosts)), draw(st.integers(1, 4)), specs[0])
    dst = (list(range(src_hosts, src_hosts + dst_hosts)), draw(st.integers(1, 4)), specs[1])
    return ReshardingProblem.build("random", shape, "float32", P3X5, src, dst)


def local_tile(layout: Layout, tensor: np.ndarray, row: int, col: int) -> np.ndarray:
    return tensor[tuple(slice(lo, hi) for lo, hi in layout.box_of(row, col))]


@settings(max_examples=150, deadline=None)
@given(problems())
def test_unit_tasks_deliver_exactly_each_destination_tile(p):
    """Moving the data as the unit tasks say builds every destination device's tile."""
    tensor = np.arange(np.prod(p.shape), dtype=np.int64).reshape(p.shape)
    src_box = {d: p.src.box_of(i, j) for i, row in enumerate(p.src.mesh.devices) for j, d in enumerate(row)}
    held = {d: local_tile(p.src, tensor, i, j) for i, row in enumerate(p.src.mesh.devices) for j, d in enumerate(row)}
    got = {d: np.full([hi - lo for lo, hi in p.dst.box_of(i, j)], -1, dtype=np.int64)
           for i, row in enumerate(p.dst.mesh.devices) for j, d in enumerate(row)}
    dst_box = {d: p.dst.box_of(i, j) for i, row in enumerate(p.dst.mesh.devices) for j, d in enumerate(row)}
    covered = np.zeros(p.shape, dtype=np.int64)
    for t in p.unit_tasks():
        covered[tuple(slice(lo, hi) for lo, hi in t.slice)] += 1
        sender = t.holders[0]
        # Every holder really holds the slice; read it from the sender's local buffer.
        for h in t.holders:
            assert all(a <= lo and hi <= b for (lo, hi), (a, b) in zip(t.slice, src_box[h]))
        part = held[sender][tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(t.slice, src_box[sender]))]
        for r in t.receivers:
            into = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(t.slice, dst_box[r]))
            got[r][into] = part
    assert (covered == 1).all()  # the slices partition the tensor: the tensor's bytes, once
    # the same tasks as intersecting every source tile with every destination tile
    naive = sorted((tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(sb, db)), tuple(h), tuple(r))
                   for db, r in p.dst.holders().items() for sb, h in p.src.holders().items()
                   if all(max(a, c) < min(b, d) for (a, b), (c, d) in zip(sb, db)))
    assert [(t.slice, t.holders, t.receivers) for t in p.unit_tasks()] == naive
    for i, row in enumerate(p.dst.mesh.devices):
        for j, d in enumerate(row):
            np.testing.assert_array_equal(got[d], local_tile(p.dst, tensor, i, j))


def test_strategies_follow_seed_002_section_3_1():
    cm = CostModel(P3X5)
    S = 2 ** 30
    receivers = [8, 9, 12, 13]  # 2 devices on each of hosts 2 and 3
    bc = unit_cost(cm, "broadcast", 0, receivers, S)
    sr = unit_cost(cm, "send-recv", 0, receivers, S)
    la = unit_cost(cm, "local-allgather", 0, receivers, S)
    ga = unit_cost(cm, "global-allgather", 0, receivers, S)
    # Send/recv: one copy per receiver device over the NIC, one after another.
    assert sr.time == pytest.approx(4 * (25e-6 + S / ETH))
    # Broadcast: about one copy over the slowest link whatever the receivers (§3.1); the
    # rest is the pipeline's fill, 2 sqrt(X a) at the best chunk count (cost.py).
    assert S / ETH < bc.time < 1.02 * S / ETH
    assert bc.time < la.time < sr.time and bc.time < ga.time
    # Local all-gather sends one copy per receiver host: twice the broadcast here.
    assert la.time == pytest.approx(2 * S / ETH, rel=0.02)
    # Only the first hop leaves the source mesh; the chain then crosses hosts once more.
    assert sum(n for a, b, n in bc.transfers if a == 0) == S
    assert sum(n for a, b, n in bc.transfers if P3X5.host(a) != P3X5.host(b)) == 2 * S
