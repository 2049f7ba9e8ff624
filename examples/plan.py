"""One verified training plan from two YAML files, written to a plan file and checked.

GPT-3 2.6B (the resharding paper §5.2) on 2 nodes of 8 V100: pipeline stages and their (data,
tensor) degrees, each stage's placement and z3-proved gradient program, a broadcast
schedule at every stage boundary, and the whole iteration simulated with them.  The plan
file is then re-checked from the two specs, and so is a hand-edited copy of it whose
gradient program no longer sums the gradients (the check must catch it).

    python examples/plan.py [PLAN_FILE]      (default: a temporary file, removed at the end)
"""

import sys
import tempfile
from pathlib import Path

import solver_planner
from solver_planner import api as sp
from solver_planner.units import format_bytes, format_time

SPECS = Path(__file__).resolve().parent.parent / "specs"
topo, spec = sp.load(SPECS / "clusters" / "p2-v100-2x8.yaml", SPECS / "models" / "gpt3-2.6b.yaml")
scratch = tempfile.TemporaryDirectory()      # removed when the script ends
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(scratch.name) / "gpt3-2.6b.plan.yaml"

plan = sp.plan(topo, spec, output=out)
print(f"{spec.name} on {topo.name}: {len(plan.parts)} stages, {plan.schedule.kind} schedule")
for s in plan.parts:
    print(f"  stage {s.index}: layers {s.first}-{s.last} on devices {s.devices[0]}-{s.devices[-1]},"
          f" d={s.data} t={s.tensor}, placement {s.matrix}, {format_bytes(s.memory)} per device,"
          f" gradient program {s.program} ({s.proof})")
for b in plan.boundaries:
    print(f"  {b.kind} {b.src}->{b.dst}: {format_time(b.time)} per micro-batch")
print(f"iteration {format_time(plan.iteration_time)} (simulated): {plan.throughput:.1f} samples/s,"
      f" MFU {plan.mfu:.1%}")
print("solve times: " + ", ".join(f"{k} {format_time(v)}" for k, v in plan.solve_times.items()))
print(f"wrote {out}")
print()

report = sp.check(topo, spec, out)
for f in report.findings:
    print(f"  {f.status:>7}  {f.part}: {f.message}")
print(f"check of {out.name}: {'passed' if report.exit_code == 0 else 'FAILED'} (exit code {report.exit_code})")

edited = solver_planner.read_plan(out)
stage = next((s for s in edited["stages"] if s["proof"] == "valid"), None)
if stage is not None:
    stage["gradient_program"] = "Reduce(root, InsideGroup)"     # only one device would end with the sum
    caught = sp.check(topo, spec, edited)
    first = caught.first_failure
    print(f"check of a copy whose stage {stage['index']} program is edited: exit code {caught.exit_code}"
          + (f", caught at {first.part}" if first else ", NOT caught"))
    if caught.exit_code != 1:
        sys.exit(1)
sys.exit(report.exit_code)
