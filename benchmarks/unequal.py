"""Do unequal meshes lower Alpa's objective?  Alpa's stage DP over all its submesh shapes,
and the same DP restricted to equal meshes.

For each instance (cluster, model, micro-batch count ``B``) the script builds Alpa's inputs
from our stage cost tables (``benchmarks/alpa_dp.py``: forward + backward seconds per
micro-batch of every layer range on every submesh shape and configuration, and the 1F1B
memory rule as ``max_n_succ_stages``) and runs the port of Alpa's ``training_dp`` (Alpa,
OSDI'22 §5.2) twice:

* ``unequal``: over all of Alpa's submesh choices ``(1, 2^i)`` and ``(n, M)``, stages may
  take different shapes (Alpa's search space);
* ``equal``: once per submesh choice, every stage on that shape, the best of them.

Columns: Alpa's objective ``sum of stage costs + (B - 1) * max stage cost`` (seconds) of
each; ``improv.`` = (equal - unequal) / equal; ``dp s`` the wall time of ``training_dp``
on all choices (``DPs``: the per-``t_max`` DPs it ran / those Alpa's literal loop would run,
the difference being the provably infeasible ``t_max`` values it skips by bisection);
``stages`` and ``meshes`` of Alpa's (unequal) solution, consecutive equal meshes as
``shape xcount``.  "no plan" means no plan fits in memory with that ``B`` (Alpa's DP
returns none).

It repeats, on more instances, a measurement reported with the request for Alpa's space
("unequal meshes lower Alpa's objective over the best equal-mesh plan by 3.4% on GPT-3 2.6B on
aws-p3.8xlarge-2; 3.1% on 6.7B on aws-p3.8xlarge-4; 1.3% on 6.7B on dgx-h100-4x8; 1.0% on 39B
on dgx-a100-8x8; nothing on 4 of 10").  Its figures differ (0-0.59% on 2.6B / p3-2, 0-6.6% on
6.7B / p3-4, 0-0.69% on 6.7B / dgx-h100, 0-2.3% on 39B): that report's micro-batch counts and
model shapes were not recorded, so which rows it measured is not known.  Models: the shipped GPT-3 2.6B and 39B specs; GPT-3 1.3B, 6.7B and 15B with the
shapes of Alpa's benchmark (``benchmark/alpa/suite_manual_gpt.py``: sequence 1024, vocabulary
51 200, global batch 1024), written inline; gpt-tiny on local-2x4.  Micro-batch counts: the
spec's when it fixes one, else 64, 128, 256, 512 and 1024 (those dividing the global batch;
every divisor above 1 for a global batch under 64).  Layers are our layer model's (embedding,
blocks, logits), not Alpa's clustering of operators into 8 or 16 layers.

    python benchmarks/unequal.py            # about 40 s on a 2-core machine (well under 2 minutes)
    python benchmarks/unequal.py --quick    # the 8-GPU clusters only, about 1 s

Printed, never asserted (tests/test_alpa_dp.py tests the DP).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from itertools import groupby
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alpa_dp import alpa_inputs, equal_mesh_dp  # noqa: E402
from solver_planner.spec import load_model_spec  # noqa: E402
from solver_planner.stages.layers import layer_model  # noqa: E402
from solver_planner.stages.search import StageSearch  # noqa: E402
from solver_planner.topology import load_topology  # noqa: E402

# Alpa's GPT shapes (benchmark/alpa/suite_manual_gpt.py, gpt_specs): layers, hidden, heads
ALPA_GPT = {"gpt3-1.3b": (24, 2048, 32), "gpt3-6.7b": (32, 4096, 32), "gpt3-15b": (48, 5120, 40)}

# (cluster, model): 8 to 64 GPUs, each model on clusters of about Alpa's sizes for it
INSTANCES = [
    ("local-2x4", "gpt-tiny"),
    ("aws-p3.8xlarge-2", "gpt3-1.3b"),
    ("aws-p3.8xlarge-2", "gpt3-2.6b"),
    ("aws-p3.8xlarge-3", "gpt3-2.6b"),
    ("aws-p3.8xlarge-4", "gpt3-6.7b"),
    ("p2-v100-2x8", "gpt3-6.7b"),
    ("dgx-h100-4x8", "gpt3-6.7b"),
    ("dgx-h100-4x8", "gpt3-15b"),
    ("p2-a100-2x16", "gpt3-15b"),
    ("dgx-a100-8x8", "gpt3-39b"),
]
QUICK = {"local-2x4", "aws-p3.8xlarge-2"}
MICROBATCHES = (64, 128, 256, 512, 1024)


def load_model(name: str):
    if name in ALPA_GPT:
        layers, hidden, heads = ALPA_GPT[name]
        text = (f"name: {name}\n"
                f"transformer: {{layers: {layers}, hidden: {hidden}, heads: {heads}, sequence: 1024, vocab: 51200}}\n"
                "training: {global_batch: 1024, microbatches: auto, dtype: float16, optimizer: adam}\n")
        return layer_model(load_model_spec(f"{name}.yaml", text))
    return layer_model(load_model_spec(ROOT / "specs" / "models" / f"{name}.yaml"))


def microbatch_counts(model) -> list[int]:
    if model.microbatches is not None:
        return [model.microbatches]
    if model.global_batch < MICROBATCHES[0]:
        return [b for b in range(2, model.global_batch + 1) if model.global_batch % b == 0]
    return [b for b in MICROBATCHES if model.global_batch % b == 0]


def meshes(solution, choices) -> str:
    shapes = [f"{choices[m][0]}x{choices[m][1]}" for _, m, _ in solution]
    return " ".join(s if n == 1 else f"{s} x{n}" for s, n in ((s, len(list(g))) for s, g in groupby(shapes)))


def row(cells, widths):
    return "  ".join(str(c).ljust(w) if i in (0, 1, 9) else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 8-GPU clusters only")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    head = ["cluster", "model", "B", "unequal s", "equal s", "improv.", "dp s", "DPs", "stages", "meshes"]
    widths = [16, 9, 4, 10, 10, 7, 6, 11, 6, 0]
    print(row(head, widths))
    improvements = []
    for cluster, name in INSTANCES:
        if args.quick and cluster not in QUICK:
            continue
        topo = load_topology(ROOT / "specs" / "clusters" / f"{cluster}.yaml")
        model = load_model(name)
        search = StageSearch(model, topo, "1f1b")        # shares the mesh tables over B
        for B in microbatch_counts(model):
            inputs = alpa_inputs(topo, model, B, search=search)
            stats: dict = {}
            cost, solution = inputs.solve(stats=stats)
            eq_cost, _, eq_m = equal_mesh_dp(inputs)
            dps = f"{stats['dps']}/{stats['alpa_dps']}"
            if solution is None:
                print(row([cluster, name, B, "no plan", "no plan" if np.isinf(eq_cost) else f"{eq_cost:.4f}",
                           "-", f"{stats['seconds']:.2f}", dps, "-", "-"], widths))
                continue
            gain = (eq_cost - cost) / eq_cost if np.isfinite(eq_cost) else np.nan
            improvements.append(gain)
            print(row([cluster, name, B, f"{cost:.4f}", f"{eq_cost:.4f}" if np.isfinite(eq_cost) else "none",
                       f"{100 * gain:.2f}%" if np.isfinite(gain) else "-", f"{stats['seconds']:.2f}", dps,
                       len(solution), meshes(solution, inputs.submesh_choices)], widths), flush=True)
    finite = [g for g in improvements if np.isfinite(g)]
    better = [g for g in finite if g > 1e-9]
    print(f"\n{len(improvements)} instances with a plan; unequal meshes lower the objective on {len(better)} "
          f"({sum(g >= 0.01 for g in finite)} by 1% or more; improvement median "
          f"{100 * statistics.median(finite):.2f}%, max {100 * max(finite):.2f}%), nothing on "
          f"{len(finite) - len(better)}; {time.perf_counter() - start:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
