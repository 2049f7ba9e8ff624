"""Sweep one model over several clusters and pipeline depths: the notebook use case.

Plans GPT-3 2.6B end to end on shipped clusters of 8 to 64 GPUs, then on 2 AWS
p3.8xlarge hosts (the resharding paper's cluster) with 1, 2, 4 and 8 pipeline stages, and prints one row per plan (or
why there is none).  The 1F1B schedule keeps the sweep quick; pass
``schedule="eager-1f1b"`` for the resharding paper's.

    python examples/sweep.py
"""

from pathlib import Path

from solver_planner import InfeasibleError, api as sp, load_model_spec, load_topology
from solver_planner.units import format_time

SPECS = Path(__file__).resolve().parent.parent / "specs"
MODEL = load_model_spec(SPECS / "models" / "gpt3-2.6b.yaml")
HEADER = (f"{'cluster':<18} {'GPUs':>4} {'stages':>6} {'d x t':>6} {'micro-batches':>13} {'iteration':>10}"
          f" {'samples/s':>9} {'MFU':>6} {'solved in':>9}")


def row(cluster: str, stages: int | None = None) -> str:
    topo = load_topology(SPECS / "clusters" / f"{cluster}.yaml")
    try:
        plan = sp.plan(topo, MODEL, schedule="1f1b", num_stages=stages)
    except InfeasibleError as exc:
        why = str(exc).split(":")[0]
        return f"{cluster:<18} {topo.num_devices:>4} {stages or '-':>6}  no plan: {why}"
    degrees = "/".join(sorted({f"{s.data}x{s.tensor}" for s in plan.parts}))
    return (f"{cluster:<18} {topo.num_devices:>4} {len(plan.parts):>6} {degrees:>6}"
            f" {plan.partition.costs.microbatches:>13} {format_time(plan.iteration_time):>10}"
            f" {plan.throughput:>9.1f} {plan.mfu:>6.1%} {format_time(sum(plan.solve_times.values())):>9}")


print(f"{MODEL.name}, global batch {MODEL.training.global_batch}, 1F1B; over clusters:")
print(HEADER)
for cluster in ("local-2x4", "p2-v100-2x8", "dgx-h100-4x8", "dgx-a100-8x8"):
    print(row(cluster))
print()
print(f"{MODEL.name} on aws-p3.8xlarge-2 over pipeline depths:")
print(HEADER)
for stages in (1, 2, 4, 8):
    print(row("aws-p3.8xlarge-2", stages))
