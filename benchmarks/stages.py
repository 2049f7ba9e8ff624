"""Stage partitioning: solve time and plan quality next to Alpa's DP recurrence.

Models: GPT-3 175B-shaped blocks (hidden 12288, 96 heads, sequence 2048), 8, 16, 32 and
96 of them plus embedding and logits (scaled along layers, as seed 001 ch. 6 scales its
GPT-3 models).  Clusters: DGX A100 nodes (specs/clusters/dgx-a100-128x8.yaml) with 1 to
128 nodes.  Goal (issue 5): 96 layers on 1 024 GPUs solved exactly in under 2 s.

"alpa dp" is a straightforward pure-Python implementation of the recurrence of Alpa's
inter-op pass (seed 003): for each tmax (ascending, stopped once B tmax beats the best),
F(s, k, d) = min over the first stage (k..i) on any sub-mesh shape of d' <= d devices and
tensor degree t with t_stage <= tmax of t_stage + F(s - 1, i + 1, d - d'), with memory for
s micro-batches in flight; here with the micro-batch count our plan chose.  Its space is
larger (stages may use different meshes), so its objective may be lower; it runs under a
time budget and reports "> budget" when it does not finish.

    python benchmarks/stages.py             # everything (several minutes, mostly Alpa's DP)
    python benchmarks/stages.py --quick     # up to 32 nodes, Alpa's DP on the two smallest
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner.spec.cluster import ClusterSpec  # noqa: E402
from solver_planner.spec.layers import TransformerSpec  # noqa: E402
from solver_planner.stages import LayerModel, StageCosts, StageSearch, mesh_shapes, plan_partition  # noqa: E402
from solver_planner.stages import transformer_layers  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

CLUSTER = ROOT / "specs" / "clusters" / "dgx-a100-128x8.yaml"


def dgx(nodes: int) -> Topology:
    data = yaml.safe_load(CLUSTER.read_text())
    data["name"] = f"dgx-a100-{nodes}x8"
    data["levels"][0]["count"] = nodes
    return Topology(ClusterSpec.model_validate(data))


def gpt(blocks: int) -> LayerModel:
    spec = TransformerSpec(layers=blocks, hidden=12288, heads=96, sequence=2048, vocab=51200)
    return LayerModel(f"gpt-{blocks}", transformer_layers(spec), 1536, None)


class OutOfTime(Exception):
    pass


def alpa_dp(search: StageSearch, B: int, budget: float) -> float:
    """Seed 003's recurrence, straightforwardly; returns the best T* found."""
    start = time.perf_counter()
    topo, model = search.topology, search.model
    N, L = topo.num_devices, model.num_layers
    shapes = mesh_shapes(topo.num_hosts, topo.devices_per_host)
    # stage times and memory of every (range, shape, t), read as plain Python lists
    table = []          # (size, time[k][i], static[k][i], act[k][i], grad[k][i])
    for shape in shapes:
        costs = StageCosts(model, topo, shape, B, "1f1b", True, search.tables(shape))
        for t in costs.degrees:
            inner = 1 if costs.stages > 2 else 0
            table.append((shape.size, costs.time(inner, t).tolist(), costs.static_memory(t).tolist(),
                          costs.activation_memory(t).tolist(), costs.gradient(t).tolist()))
    mem = topo.device.memory
    cands = sorted({x for _, tm, *_ in table for row in tm for x in row if math.isfinite(x)})
    best = math.inf
    for tmax in cands:
        if B * tmax >= best:
            break
        # F[s][k][d]: layers k.. on s stages with d devices
        F = [[[math.inf] * (N + 1) for _ in range(L + 1)] for _ in range(L + 1)]
        F[0][L][0] = 0.0
        for s in range(1, L + 1):
            if time.perf_counter() - start > budget:
                raise OutOfTime
            for k in range(L - 1, -1, -1):
                for d in range(1, N + 1):
                    val = math.inf
                    for size, tm, static, act, grad in table:
                        if size > d:
                            continue
                        for i in range(k, L):
                            ts = tm[k][i]
                            if ts > tmax or static[k][i] + min(s, B) * act[k][i] > mem:
                                continue
                            rest = F[s - 1][i + 1][d - size]
                            if rest + ts < val:
                                val = rest + ts + (grad[k][i] if k == 0 else 0.0)
                    F[s][k][d] = val
        total = min(F[s][0][N] for s in range(1, L + 1))
        if math.isfinite(total):
            best = min(best, total + (B - 1) * tmax)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--alpa-budget", type=float, default=120.0, help="seconds per Alpa DP run")
    args = ap.parse_args()
    nodes_list = [1, 4, 16, 32] if args.quick else [1, 4, 16, 64, 128]
    alpa_cases = {(8, 1), (16, 1)} if args.quick else {(8, 1), (16, 1), (16, 4), (8, 4)}
    print(f"{'layers':>6} {'gpus':>5} {'status':>8} {'solve s':>8} {'pairs':>9} {'stages':>6} {'mesh':>6} "
          f"{'B':>5} {'objective s':>12} {'alpa dp s':>10} {'alpa T s':>10} {'time ratio':>10} {'T ratio':>8}")
    for blocks in (8, 16, 32, 96):
        model = gpt(blocks)
        for nodes in nodes_list:
            topo = dgx(nodes)
            search = StageSearch(model, topo)
            t0 = time.perf_counter()
            try:
                res = plan_partition(search, "dp")
            except Exception as exc:  # noqa: BLE001 - a row per case, whatever happens
                print(f"{blocks + 2:>6} {topo.num_devices:>5} {type(exc).__name__:>8}")
                continue
            solve = time.perf_counter() - t0
            p = res.solution
            row = (f"{blocks + 2:>6} {topo.num_devices:>5} {res.status.value:>8} {solve:>8.3f} "
                   f"{res.info['solved_pairs']:>4}/{res.info['pairs']:<4} {p.costs.stages:>6} {str(p.costs.shape):>6} "
                   f"{p.costs.microbatches:>5} {res.objective:>12.4f}")
            if (blocks, nodes) in alpa_cases:
                t1 = time.perf_counter()
                try:
                    alpa = alpa_dp(search, p.costs.microbatches, args.alpa_budget)
                    el = time.perf_counter() - t1
                    row += f" {el:>10.1f} {alpa:>10.4f} {el / solve:>9.0f}x {res.objective / alpa:>8.3f}"
                except OutOfTime:
                    row += f" {'> ' + str(int(args.alpa_budget)):>10} {'-':>10} {'> ' + str(int(args.alpa_budget / solve)) + 'x':>10}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
