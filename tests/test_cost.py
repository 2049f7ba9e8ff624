"""Every formula of the cost model against a value computed by hand from the specs.

p2-a100-2x16: NVSwitch 270 GB/s, 2us, one port per GPU; NIC 8 GB/s, 10us, one per node.
"""

import math
import textwrap

import pytest

from solver_planner.cost import CostModel, bus_factor
from solver_planner.spec import load_cluster_spec
from solver_planner.topology import Topology

S = 1e9  # bytes
NVS, NIC = 270e9, 8e9
A_NVS, A_NIC = 2e-6, 10e-6


@pytest.fixture(scope="module")
def cm(a100):
    return CostModel(a100)


def test_bus_factors_are_nccls():
    assert bus_factor("allreduce", 8) == 2 * 7 / 8
    assert bus_factor("reducescatter", 8) == bus_factor("allgather", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1
    assert bus_factor("allreduce", 1) == 0


def test_point_to_point(cm):
    assert cm.transfer_time(0, 1, S) == pytest.approx(A_NVS + S / NVS)
    assert cm.transfer_time(0, 16, S) == pytest.approx(A_NIC + S / NIC)
    assert cm.transfer_time(4, 4, S) == 0


def test_link_sharing_behind_one_nic(cm):
    # 16 cross-node pairs behind one NIC share its 8 GB/s: 0.5 GB/s each.
    pairs = [(i, 16 + i) for i in range(16)]
    assert cm.transfers_time(pairs, S) == pytest.approx(A_NIC + S / (NIC / 16))
    # Pairs inside nodes have their own NVSwitch ports: no sharing.
    assert cm.transfers_time([(0, 1), (2, 3), (16, 17)], S) == pytest.approx(A_NVS + S / NVS)
    # Opposite directions do not share (full duplex).
    assert cm.transfers_time([(0, 16), (17, 1)], S) == pytest.approx(A_NIC + S / NIC)


@pytest.mark.parametrize("kind, factor, steps", [
    ("allreduce", 2 * 15 / 16, 30), ("reducescatter", 15 / 16, 15), ("allgather", 15 / 16, 15),
    ("broadcast", 1, 15), ("reduce", 1, 15),
])
def test_ring_inside_a_node(cm, kind, factor, steps):
    c = cm.collective(kind, [list(range(16))], S, "ring")
    assert c.time == pytest.approx(steps * A_NVS + factor * S / NVS)
    assert c.bus_bandwidth == NVS


def test_ring_over_both_nodes_is_bound_by_the_nic(cm):
    c = cm.collective("allreduce", [list(range(32))], S, "ring")
    # One ring edge leaves each node: the NIC is not shared, but it is the slowest link.
    assert c.time == pytest.approx(2 * 31 * A_NIC + 2 * 31 / 32 * S / NIC)
    assert c.bus_bandwidth == NIC and c.bottleneck.startswith("nic[")


def test_concurrent_groups_share_the_nic(a100, cm):
    # Reduction across nodes on 16 groups of 2 (P² §4: the 448x slower placements).
    c = cm.collective("allreduce", a100.groups_across("node"), S)
    assert c.groups == 16 and c.group_size == 2
    assert c.time == pytest.approx(2 * A_NIC + 1 * S / (NIC / 16))
    alone = cm.collective("allreduce", [[0, 16]], S)
    assert alone.time == pytest.approx(2 * A_NIC + S / NIC)
    # Concurrent intra-node groups do not slow each other down.
    both = cm.collective("allreduce", a100.groups_within("node"), S)
    one = cm.collective("allreduce", [list(range(16))], S)
    assert both.time == pytest.approx(one.time)


def test_groups_must_be_disjoint(cm):
    with pytest.raises(ValueError, match="two concurrent groups"):
        cm.collective("allreduce", [[0, 1], [1, 2]], S)


def test_single_device_group_costs_nothing(cm):
    assert cm.collective("allreduce", [[5]], S).time == 0
    assert cm.collective("broadcast", [[5], [6]], S).time == 0


def test_ring_broadcast_is_a_chain_from_the_first_device(cm):
    edges = cm.edges("broadcast", [2, 0, 1, 3], "ring")
    assert [(e.src, e.dst) for e in edges] == [(2, 3), (3, 0), (0, 1)]
    reduce_edges = cm.edges("reduce", [2, 0, 1, 3], "ring")
    assert [(e.src, e.dst) for e in reduce_edges] == [(3, 2), (0, 3), (1, 0)]
    c = cm.collective("broadcast", [[2, 0, 1, 3]], S)
    assert c.time == pytest.approx(3 * A_NVS + S / NVS)


def test_tree_on_two_nodes(cm):
    c = cm.collective("allreduce", [list(range(32))], S, "tree")
    # Chain 16->17->...->31 after the cross-node edge: 10us + 15 * 2us deep, twice for AllReduce.
    assert c.latency_term == pytest.approx(2 * (A_NIC + 15 * A_NVS))
    # Both half-trees cross 0->16: weight 1/2 + 1/2 on the NIC, so the NIC's full bandwidth.
    assert c.bus_bandwidth == NIC
    assert c.time == pytest.approx(2 * (A_NIC + 15 * A_NVS) + 2 * 31 / 32 * S / NIC)
    b = cm.collective("broadcast", [list(range(32))], S, "tree")
    assert b.time == pytest.approx(A_NIC + 15 * A_NVS + S / NIC)


def test_tree_on_four_nodes(a100x4):
    cm = CostModel(a100x4)
    c = cm.collective("allreduce", [list(range(64))], S, "tree")
    # Leaders 0,16,32,48. Tree 1 (heap): 0->16, 0->32, 16->48; tree 2 (mirrored order 0,48,32,16):
    # 0->48, 0->32, 48->16. Node 0's NIC sends 4 half-edges: bandwidth 8/2 = 4 GB/s.
    assert c.bus_bandwidth == pytest.approx(NIC / 2)
    assert c.latency_term == pytest.approx(2 * (2 * A_NIC + 15 * A_NVS))
    assert c.time == pytest.approx(2 * (2 * A_NIC + 15 * A_NVS) + 2 * 63 / 64 * S / (NIC / 2))


def test_tree_reducescatter_falls_back_to_ring(cm):
    ring = cm.collective("reducescatter", [list(range(32))], S, "ring")
    tree = cm.collective("reducescatter", [list(range(32))], S, "tree")
    assert tree.time == ring.time


def test_v100_cross_node_goes_through_pcie(v100):
    cm = CostModel(v100)
    # 8 GPUs of node 0 send to node 1 at once: each PCIe switch carries 4 (32/4 = 8 GB/s),
    # the NIC carries 8 (8/8 = 1 GB/s): the NIC is the bottleneck.
    pairs = [(i, 8 + i) for i in range(8)]
    assert cm.transfers_time(pairs, S) == pytest.approx(10e-6 + 1e-6 + S / 1e9)


def test_pcie_can_be_the_bottleneck():
    text = textwrap.dedent("""\
        name: slow-pcie
        levels: [{name: node, count: 2}, {name: gpu, count: 8}]
        device: {name: X, flops: 1 TFLOP/s, memory: 1 GiB}
        interconnects:
          - {name: nvlink, level: gpu, bandwidth: 100 GB/s}
          - {name: pcie, bandwidth: 2 GB/s, sharing: 4 devices}
          - {name: nic, level: node, bandwidth: 8 GB/s, sharing: node, via: [pcie]}
        """)
    cm = CostModel(Topology(load_cluster_spec("c.yaml", text)))
    # GPUs 0-3 share one PCIe switch: 2/4 = 0.5 GB/s each, below the NIC's 8/4 = 2 GB/s.
    assert cm.transfers_time([(i, 8 + i) for i in range(4)], S) == pytest.approx(S / 0.5e9)


def test_pipelined_broadcast_formula(p3x3):
    cm = CostModel(p3x3)
    # Chain 0 -> 4..7 (host 1) -> 8..11 (host 2): hops eth, nvl, nvl, nvl, eth, nvl, nvl, nvl.
    b = cm.pipelined_broadcast(0, list(range(4, 12)), S, chunks=4)
    assert b.chain == (0, 4, 5, 6, 7, 8, 9, 10, 11)
    eth, nvl = 25e-6 + S / 4 / 1.25e9, 2e-6 + S / 4 / 50e9
    assert b.time == pytest.approx(2 * eth + 6 * nvl + 3 * eth)


def test_pipelined_broadcast_sender_host_first(p3x3):
    cm = CostModel(p3x3)
    assert cm.broadcast_chain(5, [11, 0, 4, 7, 6]) == [5, 4, 6, 7, 0, 11]


def test_pipelined_broadcast_chooses_the_best_chunk_count(p3x3):
    cm = CostModel(p3x3)
    b = cm.pipelined_broadcast(0, list(range(4, 12)), S)
    best = min(cm.pipelined_broadcast(0, list(range(4, 12)), S, chunks=k).time for k in range(1, 2000))
    assert b.time <= best * (1 + 1e-12)


def test_pipelined_broadcast_barely_grows_with_receiving_hosts(p3x3):
    # The resharding paper §3.1: with enough chunks the time approaches one copy over the slowest link.
    cm = CostModel(p3x3)
    one_host = cm.pipelined_broadcast(0, [4, 5, 6, 7], S).time
    two_hosts = cm.pipelined_broadcast(0, list(range(4, 12)), S).time
    assert S / 1.25e9 < one_host < two_hosts < 1.02 * S / 1.25e9
    # Plain send/recv to each receiver would pay one copy per device.
    assert cm.transfers_time([(0, d) for d in range(4, 12)], S) > 7 * two_hosts


def test_compute_time(a100):
    assert CostModel(a100, "peak").compute_time(312e12) == pytest.approx(1.0)
    # the efficiency model: one kernel of F FLOPs takes overhead + (F + x_half) / (peak e_max)
    c = a100.device.compute
    want = c.kernel_overhead + (312e12 + c.half_efficiency_flops) / (312e12 * c.matmul_efficiency)
    assert CostModel(a100).compute_time(312e12) == pytest.approx(want)


def test_collective_names_are_parsed(cm):
    assert cm.collective("AllReduce", [[0, 1]], S).time == cm.collective("all_reduce", [[0, 1]], S).time
    with pytest.raises(ValueError, match="unknown collective"):
        cm.collective("alltoall", [[0, 1]], S)


def test_time_grows_linearly_with_bytes(cm):
    small = cm.collective("allreduce", [list(range(32))], S)
    big = cm.collective("allreduce", [list(range(32))], 2 * S)
    assert big.time - big.latency_term == pytest.approx(2 * (small.time - small.latency_term))
    assert math.isclose(big.latency_term, small.latency_term)


# -- issue 17: hierarchical collectives, efficiency factors, ring segments ----------------

def _variant(path: str, **changes) -> Topology:
    """A shipped cluster spec with top-level fields or interconnect fields changed."""
    spec = load_cluster_spec(path)
    ics = changes.pop("interconnects", {})
    new_ics = [ic.model_copy(update=ics.get(ic.name, {})) for ic in spec.interconnects]
    return Topology(spec.model_copy(update={**changes, "interconnects": new_ics}))


def test_collective_overlap_charges_every_level():
    # Two devices on each of two nodes of p2-a100-2x16: two rings of half the data each,
    # 0 -> 1 -> 16 -> 17 -> 0 and 1 -> 0 -> 17 -> 16 -> 1.  Each GPU's NVSwitch port sends
    # one half (share 2 x NVS); each node's NIC sends two halves (share NIC).  Bus volume
    # 2 (n-1)/n S = 1.5 S.
    group = [[0, 1, 16, 17]]
    lat = 6 * A_NIC
    y_nic, y_nvs = 1.5 * S / NIC, 1.5 * S / (2 * NVS)
    for overlap, want in ((1.0, y_nic), (0.0, y_nic + y_nvs), (0.25, y_nic + 0.75 * y_nvs)):
        cm = CostModel(_variant("specs/clusters/p2-a100-2x16.yaml", collective_overlap=overlap))
        assert cm.collective_time("allreduce", group, S) == pytest.approx(lat + want)
    # inside one level there is nothing else to charge
    cm = CostModel(_variant("specs/clusters/p2-a100-2x16.yaml", collective_overlap=0.0))
    assert cm.collective_time("allreduce", [[0, 1, 2, 3]], S) == pytest.approx(6 * A_NVS + 1.5 * S / NVS)


def test_efficiency_scales_the_bandwidth_of_its_collective_only():
    topo = _variant("specs/clusters/p2-a100-2x16.yaml",
                    interconnects={"nic": {"efficiency": {"allreduce": 0.5, "sendrecv": 0.8}}})
    cm = CostModel(topo)
    assert cm.collective_time("allreduce", [[0, 16]], S) == pytest.approx(2 * A_NIC + S / (0.5 * NIC))
    assert cm.collective_time("allgather", [[0, 16]], S) == pytest.approx(A_NIC + 0.5 * S / NIC)
    assert cm.transfer_time(0, 16, S) == pytest.approx(A_NIC + S / (0.8 * NIC))
    assert cm.transfer_time(0, 1, S) == pytest.approx(A_NVS + S / NVS)


def test_efficiency_outside_zero_one_is_refused(tmp_path):
    from solver_planner.errors import SpecError

    text = open("specs/clusters/p2-a100-2x16.yaml").read().replace(
        "sharing: node", "sharing: node\n    efficiency: {allreduce: 1.5}")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="efficiency"):
        load_cluster_spec(path)


# p2-v100-2x8: an NVLink ring of 8 GPUs per node, 135 GB/s per direction, 2us per hop.
RING = 135e9


def test_ring_segments_are_shared_where_paths_overlap(v100):
    cm = CostModel(v100)
    # 0 -> 2 crosses segments 0 and 1; 1 -> 2 crosses segment 1: they share it
    assert cm.transfers_time([(0, 2), (1, 2)], S) == pytest.approx(2 * 2e-6 + S / (RING / 2))
    # 0 -> 2 and 2 -> 4 use disjoint segments: full speed each
    assert cm.transfers_time([(0, 2), (2, 4)], S) == pytest.approx(2 * 2e-6 + S / RING)
    # opposite directions never share: 0 -> 1 clockwise, 1 -> 0 anticlockwise
    assert cm.transfers_time([(0, 1), (1, 0)], S) == pytest.approx(2e-6 + S / RING)


def test_placements_behind_one_nic_differ_by_their_intra_node_traffic():
    # Four 4-device groups across the two nodes of p2-v100-2x8, every group's NIC edges
    # behind the same NIC, so the NIC part is equal.  Each group runs two rings of half the
    # data (two devices per node).  Adjacent pairs inside a node use one ring segment per
    # ring, disjoint (load 1/2: share 2 x RING); pairs four apart cross four segments each
    # way round, and the 8 paths of a node cover each of its 8 segments 4 times (load 2:
    # share RING / 2).
    adjacent = [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    apart = [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    pipelined = CostModel(_variant("specs/clusters/p2-v100-2x8.yaml", collective_overlap=1.0))
    a = pipelined.collective("allreduce", adjacent, S)
    b = pipelined.collective("allreduce", apart, S)
    assert a.bandwidth_term == pytest.approx(b.bandwidth_term)        # only the NIC counts: a tie
    staged = CostModel(_variant("specs/clusters/p2-v100-2x8.yaml", collective_overlap=0.0))
    a = staged.collective("allreduce", adjacent, S)
    b = staged.collective("allreduce", apart, S)
    volume = 1.5 * S
    assert b.bandwidth_term - a.bandwidth_term == pytest.approx(volume / (RING / 2) - volume / (2 * RING))


def test_rings_use_every_nic_of_a_node_when_nics_are_per_device():
    # dgx-h100-4x8: a 400 Gb/s NIC per GPU.  All 16 GPUs of two nodes: 8 rings of 1/8 of the
    # data, each leaving a node through a different GPU's NIC: the bus bandwidth is 8 NICs'
    # (NCCL's rails), not one's.
    from solver_planner.topology import load_topology

    cm = CostModel(load_topology("specs/clusters/dgx-h100-4x8.yaml"))
    c = cm.collective("allreduce", [list(range(16))], S)
    assert c.bus_bandwidth == pytest.approx(8 * 50e9)
    # one NIC per node (p2-a100-2x16): the rings add up on it, as one ring's would
    one_nic = CostModel(_variant("specs/clusters/p2-a100-2x16.yaml")).collective("allreduce", [list(range(32))], S)
    assert one_nic.bus_bandwidth == pytest.approx(NIC)
