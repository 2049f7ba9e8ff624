"""Prove reduction programs valid, or show where they go wrong (P² §3.5, z3).

On 2 nodes of 8 V100 with 16-way data parallelism: a hand-written hierarchical
all-reduce (examples/hierarchical-allreduce-2x8.yaml), a broken variant of it
(examples/broken-allreduce-2x8.yaml) and the same hierarchical program written in the
DSL.  Valid means every GPU ends with the exact sum of all 16 gradients, for any data.

    python examples/verify.py
"""

from pathlib import Path

from solver_planner import api as sp
from solver_planner.units import format_time

ROOT = Path(__file__).resolve().parent.parent
topo, spec = sp.load(ROOT / "specs" / "clusters" / "p2-v100-2x8.yaml", ROOT / "specs" / "models" / "dp16.yaml")

programs = {
    "hierarchical-allreduce-2x8.yaml": ROOT / "examples" / "hierarchical-allreduce-2x8.yaml",
    "broken-allreduce-2x8.yaml": ROOT / "examples" / "broken-allreduce-2x8.yaml",
    "the same in the DSL": "ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); AllGather(node, InsideGroup)",
}
print(f"{spec.name} on {topo.name}, placement [[2,8]], reduction '{spec.reductions[0].name}'")
for label, program in programs.items():
    verdict = sp.verify(topo, spec, program, matrix="[[2,8]]")
    print(f"  {label}: {verdict.status} ({verdict.engine}, {format_time(verdict.wall_time)})")
    if verdict.violation is not None:
        print(f"    counterexample: {verdict.violation}")
print(f"  (the DSL program: {programs['the same in the DSL']})")
