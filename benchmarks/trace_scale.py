"""Trace size and write time at scale: ``--trace-detail stages`` against ``full``.

Plans gpt-tiny on ``local-2x4`` (8 GPUs), GPT-3 2.6B on ``dgx-a100-8x8`` (64) and GPT-3 175B
on ``dgx-a100-128x8`` (1 024) as ``plan`` does (the search is timed apart), then writes each
plan's trace in both details, as ``plan --trace`` writes it, and prints its events,
megabytes and seconds to write.  The "estimate MB" column is the figure ``plan --trace-detail
full`` warns with (above 100 MB); a full trace estimated over ``--full-limit`` MB is not
written and its row says "estimated".  Goal (issue 24): the 1 024-GPU plan's default trace
at most 100 MB, written in at most 10 s.

    python benchmarks/trace_scale.py                  # about a minute
    python benchmarks/trace_scale.py --full-limit 0   # full traces estimated only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's package, not an installed one
CASES = [("gpt-tiny", "local-2x4"), ("gpt3-2.6b", "dgx-a100-8x8"), ("gpt3-175b", "dgx-a100-128x8")]
GOAL_MB, GOAL_S = 100.0, 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full-limit", type=float, default=500.0, help="MB: larger full traces are only estimated")
    args = ap.parse_args()

    from solver_planner.plan import make_plan
    from solver_planner.simulate import estimate_full_bytes, write_chrome_trace
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.topology import Topology

    print(f"{'plan':30} {'GPUs':>5} {'micro-batches':>13} {'detail':>7} {'events':>9} {'MB':>7} {'estimate MB':>11}"
          f" {'write s':>8} {'search s':>8}")
    goal = None
    with tempfile.TemporaryDirectory() as tmp:
        for model, cluster in CASES:
            topo = Topology(load_cluster_spec(ROOT / f"specs/clusters/{cluster}.yaml"))
            spec = load_model_spec(ROOT / f"specs/models/{model}.yaml")
            t0 = time.perf_counter()
            plan = make_plan(topo, spec, schedule="eager-1f1b")   # the plan command's default schedule
            search = time.perf_counter() - t0
            timeline = plan.run.timeline
            size = plan.partition.costs.shape.size
            k = plan.partition.costs.microbatches
            for detail in ("stages", "full"):
                path = Path(tmp) / f"{model}-{detail}.json"
                estimate = "" if detail == "stages" else estimate_full_bytes(timeline, links=True, topology=topo)
                if detail == "full" and estimate > args.full_limit * 1e6:
                    events, mb, seconds = "estimated", "-", "-"
                else:
                    t0 = time.perf_counter()
                    write_chrome_trace(timeline, path, topo, links=True, detail=detail, stage_size=size)
                    elapsed = time.perf_counter() - t0
                    megabytes = os.path.getsize(path) / 1e6
                    events, mb, seconds = str(len(json.loads(path.read_text())["traceEvents"])), \
                        f"{megabytes:.1f}", f"{elapsed:.2f}"
                    path.unlink()
                    if detail == "stages" and topo.num_devices >= 1024:
                        goal = (megabytes, elapsed)
                est = f"{estimate / 1e6:.1f}" if estimate != "" else "-"
                print(f"{model + ' on ' + cluster:30} {topo.num_devices:5} {k:13} {detail:>7} {events:>9} {mb:>7}"
                      f" {est:>11} {seconds:>8} {search:8.1f}")
    if goal is not None:
        met = goal[0] <= GOAL_MB and goal[1] <= GOAL_S
        print(f"goal, 1 024 GPUs by default (stages): at most {GOAL_MB:.0f} MB and {GOAL_S:.0f} s;"
              f" {goal[0]:.1f} MB in {goal[1]:.2f} s: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
