"""Do the four implementations of a reduction program's meaning agree?  (Issue 12; goal: 0.)

Random explicit programs (solver_planner/reduction/generate.py: hierarchical recipes with
unsorted groups, mutated so that about half are invalid) go through

* the rules with damage tracking (reduction/verify.py),
* the z3 proof over symbolic data (reduction/proof.py),
* the numpy executor (reduction/execute.py),
* real gloo processes: every program torch can run at all, lowered by
  distributed/lower.py and executed by the package's workers (one launch per world size).

A program torch cannot run (an ill-formed call) counts as invalid for gloo.  The table
gives, per device count, how many programs each checker found valid and how many times
each pair disagreed.

    python benchmarks/verify_vs_execute.py                    # 2 000 programs, gloo on up to 12 devices
    python benchmarks/verify_vs_execute.py --programs 300 --no-gloo
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solver_planner.errors import LoweringError  # noqa: E402
from solver_planner.reduction.execute import execute  # noqa: E402
from solver_planner.reduction.generate import random_program  # noqa: E402
from solver_planner.reduction.proof import prove  # noqa: E402
from solver_planner.reduction.verify import check_program  # noqa: E402

CHECKERS = ("rules", "z3", "numpy", "gloo")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-devices", type=int, default=12, help="largest program (gloo runs one process per device)")
    ap.add_argument("--no-gloo", action="store_true", help="skip real execution")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    programs = [random_program(rng, 2, args.max_devices) for _ in range(args.programs)]
    verdicts: list[dict[str, bool]] = []
    t0 = time.perf_counter()
    for p in programs:
        out = check_program(p.num_devices, p.chunks, p.steps, p.reduction_groups)
        hint = (out.failure.device, out.failure.chunk) if out.failure is not None else None
        verdicts.append({
            "rules": out.valid,
            "z3": prove(p.num_devices, p.chunks, p.steps, p.reduction_groups, hint=hint).status == "valid",
            "numpy": execute(p.num_devices, p.chunks, p.steps, p.reduction_groups).ok})
    t_check = time.perf_counter() - t0
    t_gloo = 0.0
    if not args.no_gloo:
        from solver_planner.distributed.launch import execute_plans
        from solver_planner.distributed.lower import lower_reduction

        by_world: dict[int, list[tuple[int, object]]] = defaultdict(list)
        for i, p in enumerate(programs):
            try:
                by_world[p.num_devices].append((i, lower_reduction(p.steps, p.num_devices, p.chunks,
                                                                   p.reduction_groups, 2, title=p.recipe)))
            except LoweringError:
                verdicts[i]["gloo"] = False  # torch cannot run it
        t0 = time.perf_counter()
        for world in sorted(by_world):
            batch = by_world[world]
            print(f"gloo: {len(batch)} programs on {world} processes ...", file=sys.stderr)
            for (i, _), e in zip(batch, execute_plans([plan for _, plan in batch], "gloo", repeat=1, warmup=0)):
                verdicts[i]["gloo"] = e.ok
        t_gloo = time.perf_counter() - t0
    used = [c for c in CHECKERS if all(c in v for v in verdicts)]
    pairs = list(combinations(used, 2))
    rows: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for p, v in zip(programs, verdicts):
        row = rows[p.num_devices]
        row["programs"] += 1
        for c in used:
            row[c] += v[c]
        for a, b in pairs:
            row[f"{a}/{b}"] += v[a] != v[b]
    head = ["devices", "programs"] + [f"{c} valid" for c in used] + [f"{a}/{b}" for a, b in pairs]
    print("  ".join(f"{h:>11}" for h in head))
    total: dict[str, int] = defaultdict(int)
    for n in sorted(rows):
        cells = [n, rows[n]["programs"]] + [rows[n][c] for c in used] + [rows[n][f"{a}/{b}"] for a, b in pairs]
        for h, c in zip(head[1:], cells[1:]):
            total[h] += c
        print("  ".join(f"{c:>11}" for c in cells))
    print("  ".join(f"{c:>11}" for c in ["all"] + [total[h] for h in head[1:]]))
    disagreements = sum(total[f"{a}/{b}"] for a, b in pairs)
    print(f"\n{len(programs)} programs; disagreements between any two checkers: {disagreements}"
          f" (rules + z3 + numpy {t_check:.1f} s" + (f", gloo {t_gloo:.1f} s)" if used[-1] == "gloo" else ")"))


if __name__ == "__main__":
    main()
