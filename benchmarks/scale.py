"""Whole commands at scale: wall time and peak memory of `place`, `reduce synth`,
`reduce verify`, `stages`, and `plan` then `check` on 1 024 to 100 000 GPUs.

Every row runs the real command in a fresh process (`python -m solver_planner ...`, this
checkout first on PYTHONPATH) on the shipped DGX A100 cluster (8 GPUs a node, NVSwitch
inside, one 200 Gb/s NIC per GPU) grown to the row's node count, with a data-parallel model
filling it (one 100 MB gradient reduction).  Times are medians of ``--repeat`` runs; memory
is the largest resident set of those runs (the child's own rusage); the exit status is the
last run's (2: refused by the 2 GiB memory bound or the 1 MiB spec-file limit).  `stages`
plans GPT-3 175B (`specs/models/gpt3-175b.yaml`) and Megatron-LM's 1T-parameter GPT
(`gpt-1t.yaml`) at the default budgets; its note is the status, the gap and the devices used (on 100 000 GPUs no plan of equal meshes uses them all).
`plan` plans GPT-3 175B under 1F1B and writes the plan file that the next row `check`s (the
goal for `plan` on 100 000 GPUs: 60 s).  `deep` runs `stages` on models of 1 024 to 10 000
equal layers (``--layers``): time and memory against depth; `deep-eager` the same under the
eager-1F1B family, and `deep-plan` the whole `plan` of each (eager-1F1B, its default), then
`check` of its plan file.  `microbatches` plans and checks a small GPT at 4 096 and 65 536
micro-batches (the most a spec accepts).

    python benchmarks/scale.py                          # every family, every size
    python benchmarks/scale.py --commands verify --gpus 1024,8192 --repeat 5
    python benchmarks/scale.py --commands deep --gpus 1024 --layers 1024,10000 --repeat 1
    python benchmarks/scale.py --commands deep-plan --gpus 1024 --layers 10000 --repeat 1
    python benchmarks/scale.py --commands microbatches --gpus 32 --repeat 1

Adding a family (``stages``, ``plan``, ...): write a function ``rows(gpus, workdir)``
yielding ``(label, argv)`` pairs and add it to ``FAMILIES``.
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
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
GPUS = (1024, 8192, 16384, 100_000)
PER_NODE = 8

HIERARCHICAL = "ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); AllGather(node, InsideGroup)"


# -- inputs ----------------------------------------------------------------------------------

def specs(gpus: int, workdir: Path) -> tuple[Path, Path]:
    """The DGX A100 cluster with ``gpus / 8`` nodes, and a model whose one data axis fills it."""
    nodes = gpus // PER_NODE
    cluster = workdir / f"dgx-a100-{nodes}x8.yaml"
    if not cluster.exists():
        text = (ROOT / "specs" / "clusters" / "dgx-a100-128x8.yaml").read_text()
        cluster.write_text(text.replace("count: 128}", f"count: {nodes}}}")
                           .replace("name: dgx-a100-128x8", f"name: dgx-a100-{nodes}x8"))
    model = workdir / f"dp{gpus}.yaml"
    if not model.exists():
        model.write_text(f"name: dp{gpus}\nparallelism:\n  axes:\n    - {{name: data, size: {gpus}}}\n"
                         "reductions:\n  - {name: grads, axes: [data], bytes: 100 MB}\n")
    return cluster, model


def explicit(workdir: Path, name: str, steps: list[tuple[str, list[list[int]]]]) -> Path:
    """A YAML file of explicit steps (what `reduce verify` reads besides the DSL)."""
    path = workdir / f"{name}.yaml"
    path.write_text("steps:\n" + "".join(f"  - {{op: {op}, groups: {json.dumps(groups)}}}\n" for op, groups in steps))
    return path


def irregular(gpus: int, seed: int = 0) -> list[tuple[str, list[tuple[str, list[list[int]]]]]]:
    """Hand-written hierarchical programs over random blocks of 32 devices (each block's
    members drawn at random and written in a random order), as benchmarks/verify_scale.py
    times them without the command around them."""
    rng = random.Random(seed * 1_000_003 + gpus)
    order = rng.sample(range(gpus), gpus)
    inside = [order[i:i + 32] for i in range(0, gpus, 32)]
    across = [[block[p] for block in inside] for p in range(32)]
    mispaired = [list(g) for g in across]
    mispaired[0][0], mispaired[1][0] = mispaired[1][0], mispaired[0][0]
    return [("2 all-reduces, random blocks", [("AllReduce", inside), ("AllReduce", across)]),
            ("scatter/all-reduce/gather, random blocks", [("ReduceScatter", inside), ("AllReduce", across),
                                                           ("AllGather", inside)]),
            ("the same, two devices mispaired (invalid)", [("ReduceScatter", inside), ("AllReduce", mispaired),
                                                           ("AllGather", inside)])]


# -- command families --------------------------------------------------------------------------

Rows = Iterator[tuple[str, list[str]]]


def place_rows(gpus: int, workdir: Path) -> Rows:
    cluster, model = specs(gpus, workdir)
    yield "rank every placement", ["place", str(cluster), str(model), "--top", "1"]


def synth_rows(gpus: int, workdir: Path) -> Rows:
    cluster, model = specs(gpus, workdir)
    yield "programs of the best placement", ["reduce", "synth", str(cluster), str(model), "--top", "3"]


def verify_rows(gpus: int, workdir: Path) -> Rows:
    cluster, model = specs(gpus, workdir)
    yield "DSL: " + HIERARCHICAL.replace("(node, ", "(").replace("InsideGroup", "Inside"), \
        ["reduce", "verify", str(cluster), str(model), HIERARCHICAL]
    for n, (name, steps) in enumerate(irregular(gpus)):
        yield f"explicit: {name}", ["reduce", "verify", str(cluster), str(model),
                                    str(explicit(workdir, f"irregular-{gpus}-{n}", steps))]


def stages_rows(gpus: int, workdir: Path) -> Rows:
    cluster, _ = specs(gpus, workdir)
    for name, spec in (("GPT-3 175B", "gpt3-175b.yaml"), ("GPT 1T (Megatron-LM's)", "gpt-1t.yaml")):
        yield f"{name}, 1F1B, default budgets", ["stages", str(cluster), str(ROOT / "specs" / "models" / spec),
                                                 "--no-baselines", "--json"]


LAYERS = [1024, 2500, 5000, 10_000]     # --layers replaces them


def deep_spec(layers: int, workdir: Path) -> Path:
    """A model of ``layers`` equal layers (2 GFLOP, 4 MiB of parameters and 1 MiB of
    activations per sample each, a tensor-parallel layer's two all-reduces): depth alone."""
    path = workdir / f"deep{layers}.yaml"
    if not path.exists():
        path.write_text(f"name: deep{layers}\nlayers:\n  - {{name: l, repeat: {layers}, flops: 2 GFLOP, params: 4 MiB,"
                        " activations: 1 MiB, allreduces: 2}\ntraining: {global_batch: 1024, dtype: bfloat16,"
                        " optimizer: adam}\n")
    return path


def deep_rows(gpus: int, workdir: Path) -> Rows:
    """`stages` of models of ``--layers`` equal layers (past 1 024 layers stages start on block
    boundaries; the gap is against the bound over every cut)."""
    cluster, _ = specs(gpus, workdir)
    for layers in LAYERS:
        yield f"{layers:,} equal layers, 1F1B", ["stages", str(cluster), str(deep_spec(layers, workdir)),
                                                 "--no-baselines", "--json"]


def deep_eager_rows(gpus: int, workdir: Path) -> Rows:
    """`stages -s eager-1f1b` (the schedule family `plan` searches by default) of the deep
    models."""
    cluster, _ = specs(gpus, workdir)
    for layers in LAYERS:
        yield f"{layers:,} equal layers, eager-1F1B", ["stages", str(cluster), str(deep_spec(layers, workdir)),
                                                       "-s", "eager-1f1b", "--no-baselines", "--json"]


def deep_plan_rows(gpus: int, workdir: Path) -> Rows:
    """The whole `plan` of each deep model (its default schedule family, eager-1F1B), then
    `check` of its plan file."""
    cluster, _ = specs(gpus, workdir)
    for layers in LAYERS:
        model = deep_spec(layers, workdir)
        planfile = workdir / f"plan-deep{layers}-{gpus}.yaml"
        yield f"{layers:,} equal layers: plan -o plan.yaml", ["plan", str(cluster), str(model), "-o", str(planfile)]
        yield f"{layers:,} equal layers: check plan.yaml", ["check", str(cluster), str(model), str(planfile)]


def plan_rows(gpus: int, workdir: Path) -> Rows:
    """The whole `plan` of GPT-3 175B (1F1B, a plan file written), then `check` of that file
    (the rows run in order, so the file exists when `check` runs); then the same with `plan`'s
    default schedule family (eager-1F1B), what a user who gives no `-s` runs."""
    cluster, _ = specs(gpus, workdir)
    model = ROOT / "specs" / "models" / "gpt3-175b.yaml"
    planfile = workdir / f"plan-{gpus}.yaml"
    yield "GPT-3 175B, 1F1B: plan -o plan.yaml", ["plan", str(cluster), str(model), "-s", "1f1b", "-o", str(planfile)]
    yield "GPT-3 175B: check plan.yaml", ["check", str(cluster), str(model), str(planfile)]
    eager = workdir / f"plan-eager-{gpus}.yaml"
    yield "GPT-3 175B, default (eager-1F1B): plan -o", ["plan", str(cluster), str(model), "-o", str(eager)]
    yield "GPT-3 175B, default: check its plan", ["check", str(cluster), str(model), str(eager)]


MICROBATCHES = [4096, 65536]       # the most a spec accepts is 65 536 (training.microbatches)


def microbatch_rows(gpus: int, workdir: Path) -> Rows:
    """The whole `plan` (eager-1F1B) and `check` of a small GPT (8 blocks of 1 024) whose spec
    fixes its micro-batches at 4 096 and at 65 536, the most a spec accepts: one sample each;
    on the DGX H100 nodes (``--gpus``: 32 is 4 nodes)."""
    nodes = max(1, gpus // 8)
    base = (ROOT / "specs" / "clusters" / "dgx-h100-4x8.yaml").read_text()
    cluster = workdir / f"h100-{nodes}x8.yaml"
    cluster.write_text(base.replace("count: 4", f"count: {nodes}", 1))
    for k in MICROBATCHES:
        model = workdir / f"gpt-mb{k}.yaml"
        model.write_text("name: gpt-mb\ntransformer: {layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocab: 51200}\n"
                         f"training: {{global_batch: {k}, microbatches: {k}, dtype: bfloat16, optimizer: adam}}\n")
        planfile = workdir / f"plan-mb{k}-{gpus}.yaml"
        yield f"{k:,} micro-batches: plan -o plan.yaml", ["plan", str(cluster), str(model), "-o", str(planfile)]
        yield f"{k:,} micro-batches: check plan.yaml", ["check", str(cluster), str(model), str(planfile)]


FAMILIES: dict[str, Callable[[int, Path], Rows]] = {"place": place_rows, "synth": synth_rows, "verify": verify_rows,
                                                    "stages": stages_rows, "plan": plan_rows, "deep": deep_rows,
                                                    "deep-eager": deep_eager_rows, "deep-plan": deep_plan_rows,
                                                    "microbatches": microbatch_rows}


# -- measuring ---------------------------------------------------------------------------------

def run(argv: list[str]) -> tuple[int, float, int, str]:
    """(exit status, wall seconds, peak resident bytes, last stderr line) of one run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "solver_planner", *argv], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # both pipes read to the end before the child is reaped (by wait4, for its rusage)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(child.stderr.read()))
    reader.start()
    out = child.stdout.read()
    reader.join()
    err = errors[0]
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    lines = [line for line in err.splitlines() if line.strip()]
    return child.returncode, wall, peak, _search_note(out) or (lines[-1] if lines else "")


def _search_note(out: str) -> str:
    """A stage search's status, gap and devices used, from its --json output ('' otherwise)."""
    try:
        data = json.loads(out)
    except ValueError:
        return ""
    if not isinstance(data, dict) or "gap" not in data:
        return ""
    use = data.get("devices", {})
    return (f"{data['status']}, gap {data['gap']:.1%}, iteration {data['iteration_time']:.3g} s, devices used"
            f" {use.get('used', '?'):,} of {use.get('devices', '?'):,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", default=",".join(FAMILIES), help=f"families to run: {', '.join(FAMILIES)}")
    ap.add_argument("--gpus", default=",".join(map(str, GPUS)), help="GPU counts (multiples of 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row (the median time is shown)")
    ap.add_argument("--layers", default=",".join(map(str, LAYERS)), help="layer counts of the deep family")
    args = ap.parse_args()
    LAYERS[:] = [int(x) for x in args.layers.split(",")]
    families = [f.strip() for f in args.commands.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown command family {unknown[0]!r}; expected {', '.join(FAMILIES)}")
    print(f"{'command':<10} {'GPUs':>7}  {'case':<52} {'exit':>4} {'median s':>9} {'peak MB':>8}  note")
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            for gpus in (int(g) for g in args.gpus.split(",")):
                for label, argv in FAMILIES[family](gpus, Path(tmp)):
                    runs = [run(argv) for _ in range(args.repeat)]
                    code, _, _, note = runs[-1]
                    wall = statistics.median(r[1] for r in runs)
                    peak = max(r[2] for r in runs)
                    note = note if code != 0 or family in ("stages", "deep", "deep-eager") else ""
                    print(f"{family:<10} {gpus:>7}  {label[:52]:<52} {code:>4} {wall:>9.2f} {peak / 1e6:>8.0f}"
                          f"  {note[:100]}", flush=True)


if __name__ == "__main__":
    main()
