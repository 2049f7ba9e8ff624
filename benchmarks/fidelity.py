"""How well the planner's predictions rank what was measured, on every data set the project has.

For each data set: how many (predicted, measured) pairs, the median and worst relative error
|predicted / measured - 1|, the Spearman rank correlation between predicted and measured,
the fraction of pairs ordered as measured (pairs measured at least 5% apart; a predicted tie
counts half), and the median measured / predicted.

* **published training runs** (``benchmarks/published_runs.py``): Megatron-LM's Table 1
  (Narayanan et al. 2021, GPT 1.7 B to 1 T on 32 to 3 072 A100s), each run's published
  configuration fixed, throughput per GPU predicted on the shipped DGX A100 spec (device
  preset, nothing fitted to these runs) against the measured;

* **torchtitan's published runs** (``benchmarks/torchtitan_runs.py``): Llama 2 and 3 with
  FSDP2 on 64 A100s, tokens per second per GPU, the rows whose activation checkpointing we
  price exactly (none, full, and per-operator selective as ``selective-op``), each
  configuration fixed; nothing fitted;

* **Korthikanti et al. 2022's end-to-end runs** (``benchmarks/korthikanti_runs.py``): GPT 22 B
  to 1 T on 8 to 512 A100s with full recomputation and with selective recomputation and
  sequence parallelism (their Table 5), each configuration fixed, model FLOPs utilization
  predicted against measured; nothing fitted (the 22 B layer is the one the GEMM efficiency
  is fitted to, below);

* **MosaicML's published MPT runs** (``benchmarks/mosaicml_runs.py``): 125M to 70B with FSDP
  on 8 to 64 A100 80GB and H100 80GB GPUs, the same software on both, sequences of 512 to
  65 536 tokens, each configuration fixed, tokens per second per GPU; one row per GPU;
  nothing fitted;

* **Megatron-Core's published H100 runs** (``benchmarks/megatron_core_runs.py``): GPT 1.7 B to
  462 B on 48 to 6 144 H100s (Megatron-LM's README, r0.8.0 weak scaling), each configuration
  fixed with the overlaps the README lists, teraFLOP/s per GPU; nothing fitted;

* **measured layer times** (``benchmarks/data/layer_times_a100.csv``): Korthikanti et al.
  2022 Table 4, the forward and the backward of one 22B GPT layer on 8 A100s five ways,
  against the shipped DGX A100 spec's prediction; in sample, since the A100 presets' GEMM
  efficiency is fitted to it (``calibrate --from-layer-times``);

* **local gloo runs** (``benchmarks/execute.py``): every synthesized P² program of
  specs/models/local-2x4.yaml's reductions on two placements, and its resharding
  schedules, run on 8 local gloo processes and timed, against the prediction on a
  calibrated cluster spec (``specs/clusters/local-2x4.yaml``, or ``--calibrate`` to
  measure this machine first);
* **DistIR Table 2** (``benchmarks/distir_grid.py``): our predicted speedups of the best
  configuration over pure data, tensor and pipeline parallelism against DistIR's measured
  ones on a DGX-2, and the rows with the same best configuration / pure winner; on the
  shipped spec (hand-set compute block) and on a datasheet-only spec with the V100 preset;
* **nccl-tests logs** (``benchmarks/data/nccl-tests/``, published measurements of real
  clusters): every row of each log against the shipped cluster spec's prediction
  (datasheet numbers) and against the spec ``calibrate --from-nccl-tests`` fits to the log
  (in sample: how well the cost model's formulas can follow the measurements).

    python benchmarks/fidelity.py                   # everything (the gloo runs take minutes)
    python benchmarks/fidelity.py --skip-local      # the published data sets only
    python benchmarks/fidelity.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from solver_planner.agreement import pairwise_agreement, spearman  # noqa: E402

NCCL = ROOT / "benchmarks" / "data" / "nccl-tests"
# each published log: the level it measures when it has no rank lines (None: from them), and
# the shipped spec of the closest hardware (its datasheet numbers are the uncalibrated prediction)
NCCL_LOGS = {
    "gcp-a3mega-h100-2x8-all_reduce.log": (None, "dgx-h100-4x8.yaml"),
    "oci-bm-gpu-h100.8-2x8-all_reduce.log": (None, "dgx-h100-4x8.yaml"),
    "oci-bm-gpu4.8-a100-1x8-2x8-all_reduce.log": (None, "dgx-a100-8x8.yaml"),
    "a100-nvlink-1x8-sendrecv.log": ("gpu", "dgx-a100-8x8.yaml"),
}


def nodes(node_spec: Path, gpus: int, name: str):
    """The shipped cluster spec ``node_spec`` with as many nodes (its first level, 8 GPUs each)
    as a published run used: every benchmark of published runs prices them on it."""
    from solver_planner.spec import load_cluster_spec
    from solver_planner.topology import Topology

    spec = load_cluster_spec(node_spec)
    levels = [lv.model_copy(update={"count": gpus // 8}) if i == 0 else lv for i, lv in enumerate(spec.levels)]
    return Topology(spec.model_copy(update={"levels": levels, "name": f"{name}-{gpus // 8}x8"}))


def megatron_split(layers: int, pipeline: int) -> list[int]:
    """Layers per stage as Megatron-LM cuts a GPT: the blocks evenly, the first stages one more
    where they do not divide, plus the embedding on the first stage and the logits on the last."""
    per = [layers // pipeline + (p < layers % pipeline) for p in range(pipeline)]
    per[0] += 1
    per[-1] += 1
    return per


def summary_line(summ: dict) -> str:
    """A benchmark's closing line (the tests read the README's figures against it)."""
    rho = "n/a" if summ["spearman"] is None else format(summ["spearman"], ".3f")
    return (f"median |error| {summ['median_error']:.1%}, worst {summ['worst_error']:.1%}, Spearman {rho},"
            f" measured / predicted {summ['median_measured_over_predicted']:.2f} ({summ['pairs']} runs)")


def summary(name: str, predicted: list[float], measured: list[float], **extra) -> dict:
    ratios = [m / p for p, m in zip(predicted, measured) if p > 0]
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured) if m > 0]
    return {"data set": name, "pairs": len(predicted), "spearman": spearman(predicted, measured),
            "pairwise": pairwise_agreement(predicted, measured, 0.05),
            "median_error": statistics.median(errors) if errors else None,
            "worst_error": max(errors) if errors else None,
            "median_measured_over_predicted": statistics.median(ratios) if ratios else None, **extra}


def published(say) -> list[dict]:
    import published_runs as runs

    rows = []
    for r in runs.load_runs():
        say(f"Megatron-LM Table 1: {r.parameters:g}B on {r.gpus} GPUs")
        rows.append(runs.predict(r))
    return [summary("Megatron-LM Table 1: TFLOP/s per GPU", [r["predicted_tflops"] for r in rows],
                    [r["measured_tflops"] for r in rows])]


def torchtitan(say) -> list[dict]:
    import torchtitan_runs as runs

    say("torchtitan: Llama with FSDP2 on 64 A100s")
    topo = runs.cluster()
    rows = [runs.predict(r, topo) for r in runs.load_runs()]
    exact = [r for r in rows if r["exact"] and r["predicted_wps"] is not None]
    ranged = [r for r in rows if not r["exact"]]
    return [summary("torchtitan, Llama FSDP2 on 64 A100s: tokens/s per GPU", [r["predicted_wps"] for r in exact],
                    [r["measured_wps"] for r in exact],
                    note=f"rows priced exactly; the {len(ranged)} 'selective layer' rows lie between our full and"
                         f" no recomputation in {sum(bool(r['within']) for r in ranged)}")]


def korthikanti(say) -> list[dict]:
    import korthikanti_runs as runs

    say("Korthikanti et al. 2022 Table 5: GPT 22B to 1T on 8 to 512 A100s")
    return [runs.summary([runs.predict(r) for r in runs.load_runs()])]


def mosaicml(say) -> list[dict]:
    import mosaicml_runs as runs

    say("MosaicML MPT with FSDP on A100 and H100")
    rows = [runs.predict(r) for r in runs.load_runs()]
    return [runs.summary([r for r in rows if r["gpu"] == gpu]) for gpu in sorted({r["gpu"] for r in rows})]


def megatron_core(say) -> list[dict]:
    import megatron_core_runs as runs

    say("Megatron-Core r0.8.0: GPT 1.7B to 462B on 48 to 6 144 H100s")
    return [runs.summary([runs.predict(r) for r in runs.load_runs()])]


def layer_times(say) -> list[dict]:
    from solver_planner.spec import load_cluster_spec
    from solver_planner.stages.layer_timings import load_layer_timings, predict_layer
    from solver_planner.topology import Topology

    say("Korthikanti et al. 2022 Table 4: one layer's forward and backward")
    topo = Topology(load_cluster_spec(ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"))
    predicted, measured = [], []
    for row in load_layer_timings(ROOT / "benchmarks" / "data" / "layer_times_a100.csv"):
        predicted += predict_layer(topo, row)
        measured += [row.forward, row.backward]
    return [summary("Korthikanti et al. 2022 Table 4: layer forward/backward", predicted, measured,
                    note="in sample: the A100 presets' GEMM efficiency is fitted to it")]


def local_runs(calibrate_now: bool, repeat: int, say) -> list[dict]:
    import execute

    cluster = execute.calibrated_cluster(say) if calibrate_now else ROOT / "specs" / "clusters" / "local-2x4.yaml"
    say(f"running every program and schedule on 8 gloo processes ({cluster.name}) ...")
    cases, reshard = execute.measure(cluster, 4 * 2**20, repeat)
    programs = [row for rows in cases.values() for row in rows]
    out = [summary("local gloo: reduction programs", [r[1] for r in programs], [r[2] for r in programs])]
    out += [summary(f"local gloo: {name}", [r[1] for r in rows], [r[2] for r in rows])
            for name, rows in cases.items()]
    out.append(summary("local gloo: resharding schedules", [r[1] for r in reshard], [r[2] for r in reshard]))
    return out


DISTIR_CLUSTERS = {"shipped dgx-v100-16": "dgx-v100-16.yaml", "datasheet + preset": "dgx2-datasheet.yaml"}


def distir(quick: bool, say) -> list[dict]:
    return [row for label, file in DISTIR_CLUSTERS.items()
            for row in distir_on(ROOT / "specs" / "clusters" / file, label, quick, say)]


def distir_on(cluster: Path, label: str, quick: bool, say) -> list[dict]:
    import distir_grid as grid

    from solver_planner.spec import load_cluster_spec
    from solver_planner.spec.model import load_model_spec
    from solver_planner.topology import Topology

    table = grid.load_table()
    if quick:
        table = [r for r in table if r.batch == min(x.batch for x in table if x.model == r.model)]
    topo = Topology(load_cluster_spec(cluster))
    specs = {m: load_model_spec(p) for m, p in grid.MODELS.items()}
    rows = []
    for i, paper in enumerate(table, 1):
        say(f"DistIR Table 2 ({label}): row {i} of {len(table)} ({paper.model}, batch {paper.batch})")
        rows.append(grid.run_row(topo, specs[paper.model], paper, "efficiency"))
    agree = grid.agreement(rows)
    ours, paper = [], []
    for r in rows:
        for k in grid.BASELINES:
            if r.speedup(k) is not None and r.paper.speedup[k] is not None:
                ours.append(r.speedup(k))
                paper.append(r.paper.speedup[k])
    # speedups are time ratios: compare them as such (a larger speedup = a slower baseline)
    mlp1b = grid.agreement([r for r in rows if r.paper.model == "mlp-1b"])
    return [summary(f"DistIR Table 2 ({label}): speedups over pure D/T/P", ours, paper,
                    same_best=f"{agree['same_best']}/{agree['rows']}",
                    same_pure_winner=f"{agree['same_pure_winner']}/{agree['winner_rows']}",
                    mlp1b=f"{mlp1b['same_best']}/{mlp1b['rows']} and {mlp1b['same_pure_winner']}/"
                          f"{mlp1b['winner_rows']}")]


def nccl_logs(say) -> list[dict]:
    from solver_planner.cost import CostModel
    from solver_planner.distributed.nccl_tests import calibrate, call_time
    from solver_planner.topology import load_topology

    out = []
    for name, (level, base) in NCCL_LOGS.items():
        say(f"nccl-tests: {name}")
        log = str(NCCL / name)
        base_path = ROOT / "specs" / "clusters" / base
        cal = calibrate(base_path, [f"{level}={log}" if level else log])
        uncalibrated = CostModel(load_topology(base_path))
        measured, fitted, datasheet = [], [], []
        for f in cal.runs:
            measured += [float(t) for t in f.times]
            fitted += [float(p) for p in f.predicted]
            datasheet += [call_time(uncalibrated, f.collective, f.placement.group, float(s)) for s in f.sizes]
        out.append(summary(f"nccl-tests {name}: shipped {base}", datasheet, measured))
        out.append(summary(f"nccl-tests {name}: fitted to it", fitted, measured))
    return out


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-local", action="store_true", help="skip the local gloo runs (minutes)")
    ap.add_argument("--calibrate", action="store_true", help="calibrate this machine before the gloo runs")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per gloo plan (median)")
    ap.add_argument("--quick", action="store_true", help="only the smallest Table 2 batch of each model")
    ap.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    args = ap.parse_args(argv)

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = (published(say) + torchtitan(say) + korthikanti(say) + mosaicml(say) + megatron_core(say)
            + layer_times(say)
            + distir(args.quick, say) + nccl_logs(say))
    if not args.skip_local:
        rows += local_runs(args.calibrate, args.repeat, say)
    if args.json:
        json.dump({"data_sets": rows, "seconds": time.perf_counter() - t0}, sys.stdout, indent=1)
        print()
        return 0
    width = max(len(r["data set"]) for r in rows)
    print(f"{'data set':<{width}}  {'pairs':>5}  {'median err':>10}  {'worst err':>9}  {'Spearman':>8}  {'pairwise':>8}"
          f"  {'meas/pred':>9}  notes")
    for r in rows:
        notes = []
        if "note" in r:
            notes.append(r["note"])
        if "same_best" in r:
            notes.append(f"same best config {r['same_best']}, same pure winner {r['same_pure_winner']}"
                         f" (MLP 1B: {r['mlp1b']})")
        print(f"{r['data set']:<{width}}  {r['pairs']:>5}  {_fmt(r['median_error'], '10.1%')}"
              f"  {_fmt(r['worst_error'], '9.1%')}  {_fmt(r['spearman'], '8.3f')}  {_fmt(r['pairwise'], '8.0%')}"
              f"  {_fmt(r['median_measured_over_predicted'], '9.2f')}  {'; '.join(notes)}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
