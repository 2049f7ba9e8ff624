"""How long the discrete-event simulator takes for 1 000, 10 000 and 100 000 tasks.

Goal (issue 2): 100 000 tasks in under 5 s on one core.  Three task-graph shapes:

* pipeline: chains of compute and transfer tasks over 64 devices, as a pipeline schedule
  produces (each task on 1-2 resources, 1-2 dependencies);
* random DAG: each task holds 1-3 of 256 resources and depends on up to 2 earlier tasks;
* one resource: every task on the same resource (the longest wait queue).

Run: ``python benchmarks/simulator.py`` (add ``--sizes 1000 10000`` for a quicker look).
Times are medians of ``--repeat`` runs of ``Simulation.run`` (building the task list is
timed separately).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from solver_planner.simulate import Simulation


def pipeline(n: int) -> Simulation:
    sim = Simulation()
    devices = 64
    last = [None] * devices
    for i in range(n):
        d = i % devices
        deps = [last[d]] if last[d] is not None else []
        if i % 2:  # a transfer to the next device, after its compute
            nxt = (d + 1) % devices
            tid = sim.add(f"send {i}", 1e-3, [("tx", d), ("rx", nxt)], deps, devices=(d, nxt))
            last[nxt] = tid
        else:
            tid = sim.add(f"compute {i}", 2e-3, [("compute", d)], deps, devices=(d,), stream="compute")
        last[d] = tid
    return sim


def random_dag(n: int) -> Simulation:
    rng = random.Random(0)
    sim = Simulation()
    for i in range(n):
        resources = rng.sample(range(256), rng.randint(1, 3))
        deps = rng.sample(range(max(0, i - 500), i), min(i, rng.randint(0, 2))) if i else []
        sim.add(f"t{i}", rng.choice([1e-4, 5e-4, 1e-3]), resources, deps)
    return sim


def one_resource(n: int) -> Simulation:
    sim = Simulation()
    for i in range(n):
        sim.add(f"t{i}", 1e-3, ["nic"])
    return sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'shape':<13}{'tasks':>9}{'build s':>10}{'run s (median)':>16}{'tasks/s':>12}{'makespan s':>12}")
    for name, make in (("pipeline", pipeline), ("random DAG", random_dag), ("one resource", one_resource)):
        for n in args.sizes:
            t0 = time.perf_counter()
            sim = make(n)
            build = time.perf_counter() - t0
            runs = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                tl = sim.run()
                runs.append(time.perf_counter() - t0)
            run = statistics.median(runs)
            print(f"{name:<13}{n:>9}{build:>10.3f}{run:>16.3f}{n / run:>12.0f}{tl.makespan:>12.3f}")


if __name__ == "__main__":
    main()
