"""Rank every placement of a model's parallelism axes on a cluster (P² §3.1).

P²'s running example: data parallelism of 4 times 16 parameter shards on 4 nodes
of 16 A100, gradients reduced along the data axis.  For each placement (a parallelism
matrix: rows are the model's axes, columns the cluster's levels) the best synthesized
reduction program is compared with one plain AllReduce.

    python examples/place.py
"""

from pathlib import Path

from solver_planner import api as sp
from solver_planner.units import format_time

SPECS = Path(__file__).resolve().parent.parent / "specs"
topo, spec = sp.load(SPECS / "clusters" / "p2-a100-4x16.yaml", SPECS / "models" / "p2-example.yaml")
reports, found = sp.place(topo, spec)
print(f"{spec.name} on {topo.name}: {len(reports)} placements found by {found.method}"
      f" (rows {', '.join(spec.axis_names)}; columns {', '.join(topo.level_names)})")
print()
print(f"{'#':>2}  {'matrix':<16} {'reduction':<10} {'AllReduce':>10} {'best':>10} {'speedup':>8}  best program")
for rank, rep in enumerate(reports, 1):
    for red in rep.reductions:
        print(f"{rank:>2}  {str(rep.matrix):<16} {red.name:<10} {format_time(red.allreduce.time):>10}"
              f" {format_time(red.best.time):>10} {red.speedup:>7.2f}x  {red.best.text}")
best = reports[0]
print()
print(f"best placement {best.matrix}: its reductions take {format_time(best.cost)}"
      f" (a plain AllReduce would take {format_time(best.allreduce_cost)})")
