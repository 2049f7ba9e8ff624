"""Search time of the framework targets and of the chunked schedules against the native search.

For each instance, ``stages`` as the command line runs it (no baselines): the native search
(1F1B), ``--target megatron`` and ``--target torchtitan`` (every schedule they run), and the
native search of interleaved 1F1B and ZB-V; each timed as the median of ``--runs`` runs, with
its iteration time, status and the ratio to the native search.  Goals (issue 25): a target
search no slower than the native one; searching virtual stages at most doubles it.

    python benchmarks/targets.py            # a few minutes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's package, not an installed one
CASES = [("gpt3-39b", "dgx-a100-8x8"), ("llama-3-8b", "dgx-a100-8x8"), ("gpt3-175b-megatron", "dgx-a100-128x8")]
RUNS = [("native 1f1b", "native", "1f1b"), ("megatron", "megatron", None), ("torchtitan", "torchtitan", None),
        ("native interleaved-1f1b", "native", "interleaved-1f1b"), ("native zb-v", "native", "zb-v")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from solver_planner.errors import PlannerError
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages.report import plan_stages
    from solver_planner.topology import Topology

    print(f"{'model':20} {'cluster':16} {'search':24} {'median s':>9} {'x native':>9} {'iteration s':>12}  status")
    for model, cluster in CASES:
        path = (ROOT / "examples" / "hf" / "llama-3-8b.json" if model == "llama-3-8b"
                else ROOT / "specs" / "models" / f"{model}.yaml")
        spec = load_model_spec(path)
        topo = Topology(load_cluster_spec(ROOT / "specs" / "clusters" / f"{cluster}.yaml"))
        native = None
        for label, target, schedule in RUNS:
            times, rep, why = [], None, ""
            for _ in range(args.runs):
                t0 = time.perf_counter()
                try:
                    rep = plan_stages(topo, spec, schedule, target=target)
                except PlannerError as exc:
                    why = str(exc).split(":")[0]
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            native = med if native is None else native
            it = f"{rep.best.time:.3f}" if rep is not None else "-"
            status = f"{rep.result.status.value}" if rep is not None else f"no plan ({why})"
            print(f"{model:20} {cluster:16} {label:24} {med:9.2f} {med / native:9.2f} {it:>12}  {status}")


if __name__ == "__main__":
    main()
