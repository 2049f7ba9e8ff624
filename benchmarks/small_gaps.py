"""Certificates of the stage search on small random instances: how often the default search
proves OPTIMAL or stops within a 1% gap, and how long it takes.

Each instance is drawn from a seed: one of the shipped clusters of 8 or 16 devices
(local-2x4, aws-p3.8xlarge-2 and -4, p2-v100-2x8), a device memory of 4-32 GiB, 4-12 layers
of random FLOPs, parameters, activations and tensor-parallel all-reduces (the last layer tied
to the first in 40% of them), a global batch of 8-128, no/ZeRO-1/ZeRO-3 optimizer sharding,
recomputation off or chosen by the search; 1F1B for odd seeds, eager-1F1B for even ones.
The search runs in this process with the defaults `solver-planner stages` uses (`--method
auto`, default budgets).  Columns: status, gap, wall seconds, and what stopped the search short of OPTIMAL
(the subspace budget, or the gap reached once the bound stopped rising).

    python benchmarks/small_gaps.py                 # seeds 0-59, about a minute on one core
    python benchmarks/small_gaps.py --seeds 0-199
    python benchmarks/small_gaps.py --seeds 38 --budget 200000 --sim-budget 100000000   # larger budgets
    python benchmarks/small_gaps.py --seeds 52 --gap 0       # search on to OPTIMAL (or the budget)

Goal (the request for certificates that close): OPTIMAL or a gap of at most 1% within 2 s
on every instance of at most 16 devices and 12 layers.  Printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solver_planner.choices import DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS  # noqa: E402
from solver_planner.errors import PlannerError  # noqa: E402
from solver_planner.spec import load_model_spec  # noqa: E402
from solver_planner.stages.report import plan_stages  # noqa: E402
from solver_planner.topology import Topology, load_topology  # noqa: E402

CLUSTERS = ["local-2x4.yaml", "aws-p3.8xlarge-2.yaml", "p2-v100-2x8.yaml", "aws-p3.8xlarge-4.yaml"]


def instance(seed: int, workdir: Path):
    """(topology, model spec, schedule, a one-line description) of one seed."""
    rng = random.Random(seed)
    topo = load_topology(ROOT / "specs" / "clusters" / rng.choice(CLUSTERS))
    device = topo.spec.device.model_copy(update={"memory": rng.choice([4, 8, 16, 32]) * 2**30})
    topo = Topology(topo.spec.model_copy(update={"device": device}))
    layers = [{"name": f"l{i}", "flops": f"{rng.uniform(1, 50):.1f} GFLOP", "params": f"{rng.randint(10, 500)} MiB",
               "activations": f"{rng.randint(1, 32)} MiB", "allreduces": rng.randint(0, 2)}
              for i in range(rng.randint(4, 12))]
    tied = rng.random() < 0.4
    if tied:
        layers[-1]["tied_to"] = "l0"
    training = {"global_batch": rng.choice([8, 16, 32, 64, 128]), "dtype": "float16", "optimizer": "adam",
                "optimizer_sharding": rng.choice(["none", "zero-1", "zero-3"]),
                "recompute": rng.choice(["none", "auto"])}
    path = workdir / f"m{seed}.yaml"
    path.write_text(yaml.safe_dump({"name": f"random-{seed}", "layers": layers, "training": training}))
    schedule = "1f1b" if seed % 2 else "eager-1f1b"
    what = (f"{topo.name} ({topo.num_devices}), {len(layers)} layers{' tied' if tied else ''},"
            f" {training['optimizer_sharding']}, {schedule}")
    return topo, load_model_spec(path), schedule, what


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-59", help="a seed or a range a-b (inclusive)")
    ap.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                    help=f"subspaces solved before stopping with a gap (stages --budget; default {DEFAULT_BUDGET})")
    ap.add_argument("--sim-budget", type=int, default=DEFAULT_SIMULATIONS,
                    help=f"simulated tasks per listed plan (stages --sim-budget; default {DEFAULT_SIMULATIONS})")
    ap.add_argument("--gap", type=float, default=DEFAULT_GAP,
                    help=f"stop at this gap once the bound stops rising (stages --gap; default {DEFAULT_GAP:g}; 0: to"
                         " OPTIMAL or the budget)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'seed':>4}  {'instance':<58} {'status':<10} {'gap':>7} {'s':>6}  bound")
        for seed in seeds_of(args.seeds):
            topo, spec, schedule, what = instance(seed, Path(tmp))
            start = time.perf_counter()
            try:
                res = plan_stages(topo, spec, schedule, budget=args.budget, simulations=args.sim_budget,
                                  gap=args.gap).result
                status, gap = res.status.value, res.gap
                note = ("" if status == "OPTIMAL" else "budget" if res.info.get("budget_exhausted")
                        else "gap reached" if "stopped_at_gap" in res.info else "")
            except PlannerError as exc:
                status, gap, note = type(exc).__name__.replace("Error", "").upper(), None, str(exc)[:40]
            wall = time.perf_counter() - start
            rows.append((status, gap, wall))
            print(f"{seed:>4}  {what:<58} {status:<10} {'' if gap is None else f'{gap:.1%}':>7} {wall:>6.2f}  {note}",
                  flush=True)
    planned = [r for r in rows if r[1] is not None]
    closed = [r for r in planned if r[1] <= 0.01 and r[2] <= 2.0]
    print(f"\n{len(rows)} instances, {len(planned)} with a plan: {sum(r[0] == 'OPTIMAL' for r in planned)} OPTIMAL,"
          f" {len(closed)} OPTIMAL or within 1% in at most 2 s (goal: all); gap median"
          f" {statistics.median(r[1] for r in planned):.1%}, worst {max(r[1] for r in planned):.1%};"
          f" time median {statistics.median(r[2] for r in rows):.2f} s, worst {max(r[2] for r in rows):.2f} s")


if __name__ == "__main__":
    main()
