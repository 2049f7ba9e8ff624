"""Cut a model's layers into pipeline stages on sub-meshes (Wang's thesis, the resharding paper, DistIR).

GPT-3 2.6B (the resharding paper §5.2) on 2 AWS p3.8xlarge hosts of 4 V100: the stage planner picks
the number of stages, each stage's (data, tensor) degrees and the micro-batches, and
simulates the schedule; the objective is a proven lower bound of the simulated time.
The eager-1F1B family contains 1F1B, so its plan is never slower.

    python examples/stages.py
"""

from pathlib import Path

from solver_planner import api as sp
from solver_planner.units import format_bytes, format_span, format_time

SPECS = Path(__file__).resolve().parent.parent / "specs"
topo, spec = sp.load(SPECS / "clusters" / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "gpt3-2.6b.yaml")

# baselines: also the best 1F1B plan (and DistIR's pure strategies), for the comparison below
rep = sp.stages(topo, spec, schedule="eager-1f1b", baselines=True)
plan = rep.as_dict()
print(f"{spec.name} on {topo.name}: {len(plan['stages'])} stages of {'x'.join(map(str, plan['mesh']))} meshes,"
      f" {plan['config']['microbatches']} micro-batches of {plan['microbatch_size']}, {plan['schedule']}")
print(f"{'stage':>5}  {'layers':<24} {'devices':<8} {'d':>2} {'t':>2}  {'fwd+bwd':>9}  {'memory / device':>17}")
for i, st in enumerate(plan["stages"]):
    first, last = st["layers"]
    names = st["layer_names"]
    # what plans may fill: the device's memory less the spec's device.memory_reserved
    print(f"{i:>5}  {format_span(first, last, names):<24} {format_span(*st['devices'][:2]):<8}"
          f" {st['data']:>2} {st['tensor']:>2}  {format_time(st['time']):>9}"
          f"  {format_bytes(st['memory']):>8} / {format_bytes(topo.device.budget)}")
print(f"iteration {format_time(rep.run.iteration_time)} (simulated), bubble {rep.run.bubble_ratio:.1%};"
      f" {rep.result.status.value} ({rep.result.method}, gap {rep.result.gap:.2%},"
      f" {format_time(rep.result.wall_time)})")
base = rep.one_f_one_b.solution
print(f"best 1F1B plan: {format_time(base.time)}, so eager-1F1B is {base.time / rep.best.time:.3f}x faster")
