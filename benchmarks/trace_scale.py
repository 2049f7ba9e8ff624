"""Trace size and write time at scale: ``--trace-detail stages`` against ``full``.

Plans GPT-3 175B on ``dgx-a100-128x8`` (1 024 GPUs) and gpt-tiny on ``local-2x4`` (the plan
search is timed apart), then writes each plan's trace in both details and prints events,
megabytes and seconds.  A full trace over ``--full-limit`` MB is not written: its size is
the estimate ``plan --trace-detail full`` warns with (marked "estimated").  Goal: the
1 024-GPU plan's default trace at most 100 MB, written in at most 10 s.

    python benchmarks/trace_scale.py                  # about a minute
    python benchmarks/trace_scale.py --full-limit 5000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("gpt-tiny", "local-2x4"), ("gpt3-175b", "dgx-a100-128x8")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full-limit", type=float, default=300.0, help="MB: larger full traces are only estimated")
    args = ap.parse_args()

    from solver_planner.plan import make_plan
    from solver_planner.simulate import estimate_full_bytes, write_chrome_trace
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.topology import Topology

    print(f"{'plan':30} {'GPUs':>5} {'micro-batches':>13} {'detail':>7} {'events':>9} {'MB':>9} {'seconds':>8}"
          f" {'search s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for model, cluster in CASES:
            topo = Topology(load_cluster_spec(ROOT / f"specs/clusters/{cluster}.yaml"))
            spec = load_model_spec(ROOT / f"specs/models/{model}.yaml")
            t0 = time.perf_counter()
            plan = make_plan(topo, spec, schedule="eager-1f1b")
            search = time.perf_counter() - t0
            size = plan.partition.costs.shape.size
            k = plan.partition.costs.microbatches
            for detail in ("stages", "full"):
                path = Path(tmp) / f"{model}-{detail}.json"
                estimate = estimate_full_bytes(plan.run.timeline, links=True)
                if detail == "full" and estimate > args.full_limit * 1e6:
                    events, mb, seconds = "-", f"~{estimate / 1e6:.0f}", "-"
                else:
                    t0 = time.perf_counter()
                    write_chrome_trace(plan.run.timeline, path, topo, links=True, detail=detail, stage_size=size)
                    seconds = f"{time.perf_counter() - t0:.2f}"
                    mb = f"{os.path.getsize(path) / 1e6:.1f}"
                    events = str(len(json.loads(path.read_text())["traceEvents"]))
                    path.unlink()
                print(f"{model + ' on ' + cluster:30} {topo.num_devices:5} {k:13} {detail:>7} {events:>9} {mb:>9}"
                      f" {seconds:>8} {search:8.1f}")


if __name__ == "__main__":
    main()
