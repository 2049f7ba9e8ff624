"""Schedule cross-mesh resharding (the resharding paper §3): which host broadcasts each slice of a
tensor to the hosts of the next pipeline stage, and when.

The resharding paper §5.1.2's microbenchmarks: a (1024, 1024, 512) float16 tensor moving between two
2x4 meshes on 4 AWS p3.8xlarge hosts, under six pairs of sharding specs.  Each schedule
is replayed in the simulator before it is returned; the table compares the broadcast
schedule with Alpa's send/recv baseline.

    python examples/reshard.py
"""

from pathlib import Path

from solver_planner import api as sp
from solver_planner.units import format_bytes, format_time

SPECS = Path(__file__).resolve().parent.parent / "specs"
topo, spec = sp.load(SPECS / "clusters" / "aws-p3.8xlarge-4.yaml", SPECS / "models" / "reshard-2x4-to-2x4.yaml")

broadcast = sp.reshard(topo, spec)
send_recv = sp.reshard(topo, spec, strategy="send-recv")
print(f"{spec.name} on {topo.name}")
print(f"{'resharding':<22} {'specs':<22} {'tasks':>5} {'makespan':>10} {'bound':>10} {'gap':>6}  {'status':<9}"
      f" {'send/recv':>10} {'speedup':>7}")
for b, s in zip(broadcast, send_recv):
    plan = b.solution
    prob = plan.problem
    specs = f"{prob.src.spec} -> {prob.dst.spec}"
    print(f"{prob.name:<22} {specs:<22} {len(plan.tasks):>5} {format_time(b.objective):>10}"
          f" {format_time(b.bound):>10} {b.gap:>6.1%}  {b.status.value:<9} {format_time(s.objective):>10}"
          f" {s.objective / b.objective:>6.2f}x")

first = broadcast[0].solution
print()
print(f"the first unit tasks of '{first.problem.name}' ({format_bytes(first.problem.nbytes)} in all):")
for i in first.schedule.order()[:4]:
    task, sender = first.tasks[i], first.sender(i)
    to_hosts = sorted({topo.host(d) for d in task.receivers})
    print(f"  slice {first.problem.describe_slice(task.slice)} ({format_bytes(task.nbytes)}): host {sender.host}"
          f" (device {sender.device}) broadcasts to hosts {to_hosts}")
