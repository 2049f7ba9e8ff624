import networkx as nx
import pytest

from solver_planner.topology import Resource, load_topology

from conftest import CLUSTERS

EXPECTED = {  # file: (devices, hosts, levels)
    "p2-a100-2x16.yaml": (32, 2, ("node", "gpu")),
    "p2-a100-4x16.yaml": (64, 4, ("node", "gpu")),
    "p2-v100-2x8.yaml": (16, 2, ("node", "gpu")),
    "p2-v100-4x8.yaml": (32, 4, ("node", "gpu")),
    "aws-p3.8xlarge-2.yaml": (8, 2, ("host", "gpu")),
    "aws-p3.8xlarge-3.yaml": (12, 3, ("host", "gpu")),
    "aws-p3.8xlarge-4.yaml": (16, 4, ("host", "gpu")),
    "aws-p3.8xlarge-5.yaml": (20, 5, ("host", "gpu")),
    "dgx-v100-16.yaml": (16, 1, ("node", "gpu")),
    "dgx2-datasheet.yaml": (16, 1, ("node", "gpu")),
    "dgx-h100-4x8.yaml": (32, 4, ("node", "gpu")),
    "dgx-a100-8x8.yaml": (64, 8, ("node", "gpu")),
    "dgx-a100-128x8.yaml": (1024, 128, ("node", "gpu")),
    "local-2x2.yaml": (4, 2, ("host", "proc")),
    "local-2x4.yaml": (8, 2, ("host", "proc")),
}


def test_every_shipped_cluster_is_listed_and_loads():
    assert {p.name for p in CLUSTERS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_coordinates_round_trip_and_groups_partition(name):
    topo = load_topology(CLUSTERS / name)
    devices, hosts, levels = EXPECTED[name]
    assert (topo.num_devices, topo.num_hosts, topo.level_names) == (devices, hosts, levels)
    seen = set()
    for d in range(topo.num_devices):
        c = topo.coords(d)
        assert topo.device_at(c) == d
        seen.add(c)
    assert len(seen) == devices
    for level in topo.level_names:
        for groups in (topo.groups_within(level), topo.groups_across(level)):
            assert sorted(d for g in groups for d in g) == list(range(devices))
    # Devices of one host are contiguous and share the host coordinate.
    for h in range(hosts):
        assert {topo.host(d) for d in topo.host_devices(h)} == {h}


def test_a100_coordinates_and_groups(a100):
    assert a100.coords(0) == (0, 0)
    assert a100.coords(17) == (1, 1)
    assert a100.groups_within("node") == [list(range(16)), list(range(16, 32))]
    assert a100.groups_within("gpu") == [[d] for d in range(32)]
    across = a100.groups_across("node")
    assert len(across) == 16 and across[3] == [3, 19]
    assert a100.groups_across("gpu")[1] == list(range(16, 32))
    assert a100.divergence_level(0, 17) == 0 and a100.divergence_level(16, 17) == 1
    assert a100.divergence_level(5, 5) is None


def test_transfer_uses_interconnect_of_outermost_differing_level(a100, v100):
    assert a100.interconnect_between(0, 1).name == "nvswitch"
    assert a100.interconnect_between(0, 16).name == "nic"
    assert v100.interconnect_between(0, 7).name == "nvlink"
    assert v100.interconnect_between(7, 8).name == "nic"
    with pytest.raises(ValueError):
        a100.interconnect_between(3, 3)


def test_shared_resources_a_transfer_crosses(a100, v100):
    # All GPUs of an A100 node share the node's NIC.
    assert a100.route(3, 20).resources == (Resource("nic", 0, "tx"), Resource("nic", 1, "rx"))
    assert a100.route(15, 31).resources == a100.route(3, 20).resources
    # Inside a node each GPU has its own NVSwitch port.
    assert a100.route(3, 4).resources == (Resource("nvswitch", 3, "tx"), Resource("nvswitch", 4, "rx"))
    # V100 cross-node traffic goes through the PCIe switch of its CPU (4 GPUs each), then the NIC.
    r = v100.route(5, 9)
    assert set(r.resources) == {Resource("nic", 0, "tx"), Resource("nic", 1, "rx"),
                                Resource("pcie", 1, "tx"), Resource("pcie", 2, "rx")}
    assert r.bandwidth == 8e9
    assert r.latency == pytest.approx(10e-6 + 1e-6)


def test_ring_latency_counts_hops(v100):
    assert v100.route(0, 1).latency == pytest.approx(2e-6)
    assert v100.route(0, 4).latency == pytest.approx(4 * 2e-6)
    assert v100.route(0, 7).latency == pytest.approx(2e-6)  # the short way round


def test_dgx_h100_has_a_nic_per_gpu():
    topo = load_topology(CLUSTERS / "dgx-h100-4x8.yaml")
    assert topo.route(1, 9).resources == (Resource("infiniband", 1, "tx"), Resource("infiniband", 9, "rx"))
    assert topo.route(1, 9).bandwidth == 50e9
    assert topo.device.memory == 80e9


def test_graph_paths_cross_nics(a100, v100):
    g = a100.graph
    assert sum(1 for _, k in g.nodes(data="kind") if k == "device") == 32
    nics = [n for n, data in g.nodes(data=True) if data.get("kind") == "port" and data.get("interconnect") == "nic"]
    assert len(nics) == 2
    path = nx.shortest_path(g, ("device", 0), ("device", 17))
    assert ("port", "nic", 0) in path and ("port", "nic", 1) in path
    # V100: the NVLink ring links each GPU to its two neighbours; the NIC is reached through PCIe.
    gv = v100.graph
    assert gv.has_edge(("device", 0), ("device", 1)) and gv.has_edge(("device", 7), ("device", 0))
    path = nx.shortest_path(gv, ("device", 5), ("device", 9))
    assert path[1] == ("port", "pcie", 1) and ("port", "nic", 0) in path


def test_host_level_can_be_declared(tmp_path):
    spec = (CLUSTERS / "p2-a100-2x16.yaml").read_text().replace(
        "levels:", "host_level: node\nlevels:\n  - {name: rack, count: 1}", 1)
    path = tmp_path / "c.yaml"
    path.write_text(spec)
    topo = load_topology(path)
    assert topo.level_names == ("rack", "node", "gpu")
    assert topo.level_names[topo.host_level] == "node" and topo.num_hosts == 2


def test_summary_reports_sharing(a100):
    nic = next(ic for ic in a100.summary()["interconnects"] if ic["name"] == "nic")
    assert nic["sharing"] == "one per node" and nic["ports"] == 2 and nic["devices_per_port"] == 16
