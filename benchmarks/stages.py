"""Stage planning: solve time, certificates and plan quality on GPT-3-shaped models.

Models: GPT-3 175B-shaped blocks (hidden 12288, 96 heads, sequence 2048), 8, 16, 32 and 96
of them plus embedding and logits (10, 18, 34 and 98 layers; scaled along layers as seed
001 ch. 6 scales its GPT-3 models), global batch 1536, and the Megatron-style 98-layer
variant (selective recomputation, sequence parallelism, distributed optimizer).
Clusters: DGX A100 nodes (specs/clusters/dgx-a100-128x8.yaml) with 1 to 128 nodes.

Columns: ``objective s`` is when the least objective (the closed-form lower bound, over
every plan) was proven; ``total s`` includes the simulations; ``sim``/``obj`` the returned
plan's simulated time and objective (the least over the schedule family's members that
fit, ``Candidate.family_bound``); ``gap`` from the search's proven bound.  With
``--top N`` (on the 98-layer model at the largest scale, and on smaller cases):
``first/best`` is the simulated time of the plan with the least objective over the best
simulated time among the N plans listed (1.000: the objective's first choice is the
simulator's), ``listed`` how many plans the budget allowed, ``sim wall`` the seconds spent
simulating (``stages/fastsim.py``) and ``price wall`` pricing plans with the objective (both
included in ``total s``).

Goals (issue 13): GPT-3 175B on 1 024 GPUs solved exactly in under 1 s; --top 10 in
under 2 s.  Printed, never asserted.

    python benchmarks/stages.py             # everything (a few minutes)
    python benchmarks/stages.py --quick     # up to 16 nodes, and the 175B case
    python benchmarks/stages.py --top-only  # only the --top table
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner.errors import PlannerError  # noqa: E402
from solver_planner.spec.layers import TransformerSpec  # noqa: E402
from solver_planner.stages import LayerModel, MemoryOptions, StageSearch, plan_partition  # noqa: E402
from solver_planner.stages import search as _search  # noqa: E402
from solver_planner.stages import transformer_layers  # noqa: E402
from solver_planner.subcluster import first_devices  # noqa: E402
from solver_planner.topology import Topology, load_topology  # noqa: E402

CLUSTER = ROOT / "specs" / "clusters" / "dgx-a100-128x8.yaml"


def dgx(nodes: int) -> Topology:
    # the first nodes of the shipped spec, loaded as a user's file is (it fills in the device preset)
    return first_devices(load_topology(CLUSTER), nodes * 8)


def gpt(blocks: int, megatron: bool = False) -> LayerModel:
    spec = TransformerSpec(layers=blocks, hidden=12288, heads=96, sequence=2048, vocab=51200)
    opts = MemoryOptions(("selective",), "distributed", True) if megatron else MemoryOptions()
    name = f"gpt-{blocks + 2}" + ("-megatron" if megatron else "")
    return LayerModel(name, transformer_layers(spec), 1536, None, options=opts)


def run(model: LayerModel, nodes: int, top: int = 1):
    topo = dgx(nodes)
    t0 = time.perf_counter()
    res = plan_partition(StageSearch(model, topo), "dp", top=top)
    return res, time.perf_counter() - t0


def row(model: LayerModel, nodes: int) -> str:
    head = f"{model.name:>18} {nodes * 8:>5}"
    try:
        res, total = run(model, nodes)
    except PlannerError as exc:
        return f"{head} {type(exc).__name__}: {str(exc)[:60]}"
    c = res.solution
    p = c.plan
    solve = res.info.get("objective_proven_after", total)
    return (f"{head} {res.status.value:>8} {solve:>11.3f} {total:>8.3f} {res.info.get('subspaces', 0):>6}"
            f" {res.info.get('simulations', 0):>5} {p.costs.stages:>4} {str(p.costs.shape):>6} {p.costs.microbatches:>5}"
            f" {c.time:>9.3f} {c.family_bound:>9.3f} {c.family_bound / c.time:>7.4f} {res.gap:>7.2%}")


class _Timed:
    """Wall time spent in one function of the search module (wrapped while the with block runs)."""

    def __init__(self, name: str):
        self.name, self.seconds = name, 0.0

    def __enter__(self):
        self.inner = getattr(_search, self.name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return self.inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(_search, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(_search, self.name, self.inner)


def top_row(model: LayerModel, nodes: int, top: int) -> tuple[str, float | None]:
    head = f"{model.name:>18} {nodes * 8:>5} {top:>4}"
    try:
        with _Timed("evaluate") as sim, _Timed("_price") as price:
            res, total = run(model, nodes, top)
    except PlannerError as exc:
        return f"{head} {type(exc).__name__}", None
    listed = res.solutions
    first = min(listed, key=lambda c: (c.family_bound, c.time))
    best = min(c.time for c in listed)
    ratio = first.time / best
    return (f"{head} {total:>8.2f} {sim.seconds:>8.2f} {price.seconds:>10.2f} {len(listed):>6}"
            f" {res.info.get('simulations', 0):>5} {res.info.get('simulated_tasks', 0):>9} {ratio:>10.4f}"
            f" {res.status.value:>8}"), ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--top-only", action="store_true", help="only the --top table")
    args = ap.parse_args()
    nodes_list = [1, 4, 16] if args.quick else [1, 4, 16, 64, 128]
    cases = [(gpt(b), n) for b in (8, 16, 32, 96) for n in nodes_list]
    if args.quick:
        cases.append((gpt(96), 128))
    cases.append((gpt(96, megatron=True), 128))
    if not args.top_only:
        print(f"{'model':>18} {'gpus':>5} {'status':>8} {'objective s':>11} {'total s':>8} {'subsp':>6} {'sims':>5}"
              f" {'S':>4} {'mesh':>6} {'B':>5} {'sim s':>9} {'obj s':>9} {'obj/sim':>7} {'gap':>7}")
        for model, nodes in cases:
            print(row(model, nodes), flush=True)
        print()
    print(f"{'model':>18} {'gpus':>5} {'top':>4} {'total s':>8} {'sim wall':>8} {'price wall':>10} {'listed':>6} {'sims':>5}"
          f" {'sim tasks':>9} {'first/best':>10} {'status':>8}")
    ratios = []
    top_cases = [(gpt(96), 128), (gpt(32), 16), (gpt(16), 4)] if not args.quick else [(gpt(96), 128), (gpt(16), 4)]
    for model, nodes in top_cases:
        text, ratio = top_row(model, nodes, args.top)
        print(text, flush=True)
        if ratio is not None:
            ratios.append(ratio)
    if ratios:
        print(f"\nmedian first/best over the --top cases: {statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
