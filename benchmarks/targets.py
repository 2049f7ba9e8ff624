"""Search time of the framework targets and of the chunked schedules against the native search.

For each instance, the whole ``solver-planner stages ... --no-baselines --json`` command (start-up,
spec loading and output included, this checkout's package): the native search
(1F1B), ``--target megatron`` and ``--target torchtitan`` (every schedule they run), and the
native search of interleaved 1F1B and ZB-V; each timed as the median of ``--runs`` runs, with
its iteration time, status and the ratio to the native search.  Goals (issue 25): a target
search no slower than the native one; searching virtual stages at most doubles it.

    python benchmarks/targets.py            # a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's package, not an installed one
CASES = [("gpt3-39b", "dgx-a100-8x8"), ("llama-3-8b", "dgx-a100-8x8"), ("gpt3-175b-megatron", "dgx-a100-128x8")]
RUNS = [("native 1f1b", "native", "1f1b"), ("megatron", "megatron", None), ("torchtitan", "torchtitan", None),
        ("native interleaved-1f1b", "native", "interleaved-1f1b"), ("native zb-v", "native", "zb-v")]


def _command(cluster: Path, model: Path, target: str, schedule: str | None) -> tuple[float, dict | None, str]:
    argv = [sys.executable, "-m", "solver_planner", "stages", str(cluster), str(model), "--no-baselines", "--json",
            "--target", target] + (["--schedule", schedule] if schedule else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if out.returncode:
        return elapsed, None, out.stderr.strip().splitlines()[-1].split(":")[1].strip() if out.stderr else "?"
    return elapsed, json.loads(out.stdout), ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    print(f"{'model':20} {'cluster':16} {'search':24} {'median s':>9} {'x native':>9} {'iteration s':>12}  status")
    for model, cluster in CASES:
        path = (ROOT / "examples" / "hf" / "llama-3-8b.json" if model == "llama-3-8b"
                else ROOT / "specs" / "models" / f"{model}.yaml")
        cpath = ROOT / "specs" / "clusters" / f"{cluster}.yaml"
        native = None
        for label, target, schedule in RUNS:
            runs = [_command(cpath, path, target, schedule) for _ in range(args.runs)]
            med = statistics.median(t for t, _, _ in runs)
            native = med if native is None else native
            _, data, why = runs[-1]
            it = f"{data['iteration_time']:.3f}" if data else "-"
            status = data["status"] if data else f"no plan ({why})"
            print(f"{model:20} {cluster:16} {label:24} {med:9.2f} {med / native:9.2f} {it:>12}  {status}")


if __name__ == "__main__":
    main()
