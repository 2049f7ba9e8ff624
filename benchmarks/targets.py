"""Search time of the framework targets and of the chunked schedules against the native search.

For each instance, the whole ``solver-planner stages ... --no-baselines --json`` command (start-up,
spec loading and output included, this checkout's package), each timed as the median of
``--runs`` runs (wall time, and the CPU time of the command's process, which a busy machine
disturbs far less: the commands are single-threaded), with its iteration time and status, and
two ratios of CPU times:

* ``x native``: against the native default (1F1B with per-stage configurations);
* ``x ref``: against the search it extends: a target's 1F1B search against the native 1F1B one
  (same schedule; goal: at most 1, a target search is no slower than a native one), a target's
  search of every schedule it runs against its 1F1B search, the native interleaved 1F1B and ZB-V
  searches against the native 1F1B one (goal: at most 2, virtual stages at most double it).

    python benchmarks/targets.py            # a few minutes
    python benchmarks/targets.py --runs 1   # one run each
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's package, not an installed one
CASES = [("gpt3-39b", "dgx-a100-8x8"), ("llama-3-8b", "dgx-a100-8x8"), ("gpt3-175b-megatron", "dgx-a100-128x8")]
# (label, target, schedule, the label of its reference, goal of the ratio to it)
RUNS = [("native 1f1b", "native", "1f1b", None, None),
        ("megatron 1f1b", "megatron", "1f1b", "native 1f1b", 1.0),
        ("megatron (all)", "megatron", None, "megatron 1f1b", 2.0),
        ("torchtitan 1f1b", "torchtitan", "1f1b", "native 1f1b", 1.0),
        ("torchtitan (all)", "torchtitan", None, "torchtitan 1f1b", 2.0),
        ("native interleaved-1f1b", "native", "interleaved-1f1b", "native 1f1b", 2.0),
        ("native zb-v", "native", "zb-v", "native 1f1b", 2.0)]


def _command(cluster: Path, model: Path, target: str, schedule: str | None) -> tuple[float, float, dict | None, str]:
    """(wall seconds, CPU seconds of the command's process, its JSON, why it failed)."""
    argv = [sys.executable, "-m", "solver_planner", "stages", str(cluster), str(model), "--no-baselines", "--json",
            "--target", target] + (["--schedule", schedule] if schedule else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode:
        return elapsed, cpu, None, out.stderr.strip().splitlines()[-1].split(":")[1].strip() if out.stderr else "?"
    return elapsed, cpu, json.loads(out.stdout), ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    print(f"{'model':20} {'cluster':16} {'search':24} {'wall s':>7} {'CPU s':>6} {'x native':>9} {'x ref':>6}"
          f" {'goal':>5} {'iteration s':>12}  status")
    for model, cluster in CASES:
        path = (ROOT / "examples" / "hf" / "llama-3-8b.json" if model == "llama-3-8b"
                else ROOT / "specs" / "models" / f"{model}.yaml")
        cpath = ROOT / "specs" / "clusters" / f"{cluster}.yaml"
        cpus: dict[str, float] = {}
        for label, target, schedule, ref, goal in RUNS:
            runs = [_command(cpath, path, target, schedule) for _ in range(args.runs)]
            wall = statistics.median(r[0] for r in runs)
            cpu = cpus[label] = statistics.median(r[1] for r in runs)
            _, _, data, why = runs[-1]
            it = f"{data['iteration_time']:.3f}" if data else "-"
            status = data["status"] if data else f"no plan ({why})"
            ratio = f"{cpu / cpus[ref]:6.2f}" if ref else f"{'':6}"
            bar = f"{goal:5.0f}" if goal else f"{'':5}"
            print(f"{model:20} {cluster:16} {label:24} {wall:7.2f} {cpu:6.2f} {cpu / cpus['native 1f1b']:9.2f} {ratio}"
                  f" {bar} {it:>12}  {status}", flush=True)


if __name__ == "__main__":
    main()
