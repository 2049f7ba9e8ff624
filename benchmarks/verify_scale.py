"""How long a proof takes on large systems: `reduce verify` on explicit programs of up to 8
steps over 1 024 and 8 192 devices (issue 12's goal: under 1 s and under 10 s; issue 27's:
the same for the whole command).

Programs: hierarchical all-reduces over random blocks (the devices of a block drawn at
random, each group written in a random order), the same with a scatter, two levels of
scatter, reduce/broadcast through roots, several reduction groups at once, a scatter over
every device, reductions that add different chunks together, damage a later broadcast
discards, and random mutations (about half invalid).  Times are medians of three runs of the whole
verification: the layout, the rules (which name the counterexample) and the z3 proof; and,
in the last column, of the whole command (`python -m solver_planner reduce verify` on a
DGX A100 cluster of ``devices / 8`` nodes, the steps written to a YAML file) for the
programs whose reduction groups a placement gives (every device, or the 8 strided groups
of a model axis of 8 on the GPUs), "-" for the others.

    python benchmarks/verify_scale.py [--devices 1024,8192] [--random 6] [--no-command]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solver_planner.cost import Collective  # noqa: E402
from solver_planner.reduction.generate import random_program  # noqa: E402
from solver_planner.reduction.proof import prove  # noqa: E402
from solver_planner.reduction.verify import check_program  # noqa: E402

AR, RS, AG, RED, BC = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.REDUCE,
                       Collective.BROADCAST)


def blocks(rng: random.Random, members: list[int], b: int) -> tuple[list[list[int]], list[list[int]]]:
    """Random blocks of ``b`` (each in a random order) and the groups across them by position."""
    order = rng.sample(members, len(members))
    inside = [order[i:i + b] for i in range(0, len(order), b)]
    return inside, [[blk[p] for blk in inside] for p in range(b)]


def cases(n: int, rng: random.Random, randoms: int):
    everyone = list(range(n))
    inside, across = blocks(rng, everyone, 32)
    yield "2 all-reduces, random blocks of 32", [everyone], [(AR, inside), (AR, across)]
    yield "scatter / all-reduce / gather, blocks of 32", [everyone], [(RS, inside), (AR, across), (AG, inside)]
    inner, outer = blocks(rng, everyone, 8)
    subs = [o[i:i + 16] for o in outer for i in range(0, len(o), 16)]
    cross = [[o[i + j] for i in range(0, len(o), 16)] for o in outer for j in range(16)]
    yield "two levels of scatter (8, then 16)", [everyone], [(RS, inner), (RS, subs), (AR, cross), (AG, subs),
                                                              (AG, inner)]
    roots = [blk[0] for blk in inside]
    yield "reduce / all-reduce of roots / broadcast", [everyone], [(RED, inside), (AR, [roots]), (BC, inside)]
    groups = [everyone[i::8] for i in range(8)]  # 8 strided reduction groups
    parts = [blocks(rng, g, 16) for g in groups]
    yield "8 reduction groups, scatter / all-reduce / gather", groups, [
        (RS, [b for p in parts for b in p[0]]), (AR, [a for p in parts for a in p[1]]),
        (AG, [b for p in parts for b in p[0]])]
    bad = [list(g) for g in across]
    bad[0][0], bad[1][0] = bad[1][0], bad[0][0]  # two devices paired with the wrong blocks
    yield "scatter / all-reduce / gather, two devices mispaired", [everyone], [(RS, inside), (AR, bad), (AG, inside)]
    order = rng.sample(everyone, n)
    yield "scatter over everyone (random order), gather back", [everyone], [(RS, [order]), (AG, [everyone])]
    pairs = [[order[i], order[i + 1]] for i in range(0, n, 2)]
    yield "scatter over everyone, all-reduce of pairs holding different chunks", [everyone], [
        (RS, [order]), (AR, pairs), (AG, [everyone])]
    half = everyone[:n // 2]
    yield "damage on half the devices, then a broadcast over it (valid)", [everyone], [
        (AR, [everyone]), (RS, [half]), (AR, [half[i:i + 2] for i in range(0, len(half), 2)]),
        (BC, [[n // 2] + half])]
    made = 0
    while made < randoms:
        p = random_program(rng, num_devices=n, mutate=0.6)
        if len(p.steps) <= 8:
            made += 1
            yield f"random: {p.recipe}", p.reduction_groups, p.steps


def command_inputs(n: int, groups, tmp: Path) -> list[str] | None:
    """Cluster, model and --matrix for the whole command, when a placement gives ``groups``."""
    everyone = list(range(n))
    if [sorted(g) for g in groups] == [everyone]:
        axes, reduce_over, matrix = [("data", n)], "data", f"[[{n // 8},8]]"
    elif [sorted(g) for g in groups] == [everyone[i::8] for i in range(8)]:
        axes, reduce_over, matrix = [("data", n // 8), ("model", 8)], "data", f"[[{n // 8},1],[1,8]]"
    else:
        return None
    root = Path(__file__).resolve().parent.parent
    cluster, model = tmp / f"dgx-{n}.yaml", tmp / f"model-{n}-{len(axes)}.yaml"
    cluster.write_text((root / "specs/clusters/dgx-a100-128x8.yaml").read_text()
                       .replace("count: 128}", f"count: {n // 8}}}").replace("name: dgx-a100-128x8", "name: dgx"))
    model.write_text("name: m\nparallelism:\n  axes:\n" + "".join(f"    - {{name: {a}, size: {s}}}\n" for a, s in axes)
                     + f"reductions:\n  - {{name: grads, axes: [{reduce_over}], bytes: 100 MB}}\n")
    return [str(cluster), str(model), "--matrix", matrix]


def whole_command(inputs: list[str], steps, tmp: Path) -> tuple[float, int]:
    """(median seconds, exit status) of `reduce verify` on ``steps`` written to a file."""
    path = tmp / "steps.yaml"
    path.write_text("steps:\n" + "".join(f"  - {{op: {Collective.parse(k).value}, groups: {json.dumps(g)}}}\n"
                                        for k, g in steps))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "solver_planner", "reduce", "verify", inputs[0], inputs[1], str(path), *inputs[2:]]
    return timed(lambda: subprocess.run(argv, capture_output=True, cwd=root, env=env).returncode)


def timed(fn, repeat: int = 3):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1024,8192")
    ap.add_argument("--random", type=int, default=6, help="random programs per size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-command", action="store_true", help="time the library calls only")
    args = ap.parse_args()
    print(f"{'devices':>7}  {'program':<58} {'steps':>5}  {'verdict':<8} {'proof':>8} {'rules':>8} {'sums':>5}"
          f" {'command':>8}")
    worst, worst_command = {}, {}
    tmp = Path(tempfile.mkdtemp())
    for n in (int(x) for x in args.devices.split(",")):
        rng = random.Random(args.seed * 1000 + n)
        for name, groups, steps in cases(n, rng, args.random):
            k = len(groups[0])
            t_rules, outcome = timed(lambda: check_program(n, k, steps, groups))
            # As `reduce verify` does: the rules' finding is z3's first suspect.
            hint = (outcome.failure.device, outcome.failure.chunk) if outcome.failure is not None else None
            t_proof, proof = timed(lambda: prove(n, k, steps, groups, hint=hint))
            if outcome.valid != (proof.status == "valid"):
                raise SystemExit(f"disagreement on {name}: rules {outcome.valid}, z3 {proof.status}")
            total = t_rules + t_proof
            worst[n] = max(worst.get(n, 0.0), total)
            inputs = None if args.no_command else command_inputs(n, groups, tmp)
            command = "-"
            if inputs is not None:
                t_command, code = whole_command(inputs, steps, tmp)
                if code != {"valid": 0, "invalid": 1}[proof.status]:
                    raise SystemExit(f"the command exits {code} on {name}, the proof says {proof.status}")
                worst_command[n] = max(worst_command.get(n, 0.0), t_command)
                command = f"{t_command:.2f}s"
            print(f"{n:>7}  {name[:58]:<58} {len(steps):>5}  {proof.status:<8} {t_proof:>7.3f}s {t_rules:>7.3f}s"
                  f" {proof.terms:>5} {command:>8}")
    print()
    for n, t in worst.items():
        whole = f"; slowest whole command {worst_command[n]:.2f} s" if n in worst_command else ""
        print(f"{n} devices: slowest verification (rules + proof) {t:.2f} s{whole}")


if __name__ == "__main__":
    main()
