"""The cost model's collective formula over arrays against the cost model's own objects."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver_planner import collective_arrays as arrays
from solver_planner.cost import Algorithm, Collective, CostModel
from solver_planner.spec import load_cluster_spec
from solver_planner.topology import Topology


def cluster(counts, sharing, via, overlap):
    names = [f"l{j}" for j in range(len(counts))]
    lines = ["name: random", "levels:"] + [f"  - {{name: {n}, count: {c}}}" for n, c in zip(names, counts)]
    lines += ["device: {name: gpu, flops: 100 TFLOP/s, memory: 80 GiB}", f"collective_overlap: {overlap}",
              "interconnects:"]
    for j, n in enumerate(names):
        share = {0: "device", 1: names[max(j - 1, 0)], 2: "2 devices"}[sharing[j] if j else 0]
        extra = f", via: [ic{len(names) - 1}]" if via and j < len(names) - 1 else ""
        lines.append(f"  - {{name: ic{j}, level: {n}, bandwidth: {7 * (j + 1)} GB/s, latency: {3 + j}us,"
                     f" sharing: {share}, efficiency: {{allreduce: 0.{9 - j}}}{extra}}}")
    return Topology(load_cluster_spec("<random>", "\n".join(lines) + "\n"))


def random_groups(rng, n, shape):
    devices = list(range(n))
    if shape == "blocks":          # contiguous blocks, as a hierarchy's InsideGroup
        size = rng.choice([d for d in range(2, n + 1) if n % d == 0])
        return [devices[i:i + size] for i in range(0, n, size)]
    if shape == "strided":         # across blocks, as Parallel
        stride = rng.choice([d for d in range(1, n // 2 + 1) if n % d == 0])
        return [devices[i::stride] for i in range(stride)]
    rng.shuffle(devices)           # anything: unsorted, unequal, some devices idle
    groups, i = [], 0
    while i < n:
        size = rng.randint(1, max(1, n // 3))
        groups.append(devices[i:i + size])
        i += size + rng.randint(0, 1)
    return groups


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3), st.lists(st.integers(0, 2), min_size=3,
       max_size=3), st.booleans(), st.sampled_from([1.0, 0.4]), st.sampled_from(list(Collective)),
       st.sampled_from(["ring", "tree"]), st.sampled_from(["blocks", "strided", "any"]), st.randoms(use_true_random=False))
def test_arrays_give_the_cost_models_numbers(counts, sharing, via, overlap, kind, algorithm, shape, rng):
    counts = [c * 2 for c in counts]
    topo = cluster(counts, sharing, via, overlap)
    assume(arrays.covers(topo, kind, Algorithm(algorithm)))
    groups = [g for g in random_groups(rng, topo.num_devices, shape) if g]
    sizes = [rng.choice([1e6, 3.3e7, 1e9]) for _ in groups]
    old = arrays.ARRAY_THRESHOLD
    arrays.ARRAY_THRESHOLD = 10**9
    try:
        want = CostModel(topo).collective(kind, groups, sizes, algorithm)
    finally:
        arrays.ARRAY_THRESHOLD = old
    got = arrays.collective_arrays(CostModel(topo), kind, Algorithm(algorithm), [list(g) for g in groups], sizes)
    assert got.group_times == want.group_times          # to the last bit
    assert (got.time, got.latency_term, got.bandwidth_term, got.bus_bandwidth, got.bottleneck) == \
        (want.time, want.latency_term, want.bandwidth_term, want.bus_bandwidth, want.bottleneck)
    assert got.resources == want.resources and len(got.resources) == len(want.resources)
    assert (got.nbytes, got.groups, got.group_size, got.collective, got.algorithm) == \
        (want.nbytes, want.groups, want.group_size, want.collective, want.algorithm)


def test_large_steps_take_the_arrays_and_ring_interconnects_do_not():
    topo = cluster([64, 16], [0, 0, 0], False, 1.0)
    assert arrays.covers(topo, Collective.ALLREDUCE, Algorithm.RING)
    assert not arrays.covers(topo, Collective.ALLREDUCE, Algorithm.TREE)
    assert arrays.covers(topo, Collective.ALLGATHER, Algorithm.TREE)
    cost = CostModel(topo).collective("allreduce", [list(range(1024))], 1e9)
    assert type(cost.resources).__name__ == "_Resources" and len(cost.resources) == 2 * 1024 * 2
    ring = Topology(load_cluster_spec("<ring>", "name: r\nlevels: [{name: n, count: 8}]\n"
                                      "device: {name: g, flops: 1 TFLOP/s, memory: 1 GiB}\n"
                                      "interconnects: [{name: x, level: n, bandwidth: 1 GB/s, latency: 1us,"
                                      " shape: ring}]\n"))
    assert not arrays.covers(ring, Collective.ALLREDUCE, Algorithm.RING)
