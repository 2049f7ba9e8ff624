"""Predicted against measured: published end-to-end GPT training runs on A100 clusters.

Each run of Narayanan et al. 2021 (Megatron-LM, Table 1: 1.7 B to 1 T parameters on 32 to
3 072 A100s; ``benchmarks/data/megatron_table1.csv``) is planned with its published
configuration fixed: tensor and pipeline sizes, the micro-batch size, blocks split evenly
with the embedding on the first stage and the logits on the last, the data-parallel
all-reduce overlapping the backward or after it, each micro-batch's weight gradients added
into the gradient buffer (``gradient_accumulation: add``), and plain or interleaved 1F1B with the
published chunks per device (the settings of Megatron-LM's own script for the table, see
the data file).  1F1B runs go through ``api.stages(config=(d, t, p, k), split=...)``;
interleaved ones, which ``stages`` searches over every chunk count, are that plan at the
published count (:func:`interleaved`), simulated as the search simulates it.  On the shipped DGX A100 nodes (``specs/clusters/dgx-a100-8x8.yaml``'s node,
preset A100-SXM4-80GB, with as many nodes as the run used).  Nothing is fitted to these runs:
the device numbers come from datasheets and microbenchmarks.

Per run: measured and predicted teraFLOP/s per GPU (the paper's FLOP count over the
iteration time), and predicted / measured - 1.  At the end: median and worst absolute error
and the Spearman rank correlation of predicted with measured throughput per GPU.

    python benchmarks/published_runs.py                 # all ten runs (about a minute)
    python benchmarks/published_runs.py --runs 1.7,39.1 --json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner import api  # noqa: E402
from solver_planner.agreement import spearman  # noqa: E402
from solver_planner.spec.layers import TrainingSpec, TransformerSpec  # noqa: E402
from solver_planner.spec.model import ModelSpec  # noqa: E402
from solver_planner.stages.layers import layer_model  # noqa: E402
from solver_planner.stages.pipeline import simulate_schedule  # noqa: E402
from solver_planner.stages.report import Config, shape_of  # noqa: E402
from solver_planner.stages.search import StageSearch  # noqa: E402
from solver_planner.stages.uniform import uniform_plans  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "megatron_table1.csv"
NODE = ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml"
SEQUENCE, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Run:
    parameters: float
    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    micro_batch: int
    overlap: bool                   # PyTorch DDP ('torch'): the all-reduce overlaps the backward
    virtual: int                    # model chunks per device (1: plain 1F1B)

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline)

    @property
    def microbatches(self) -> int:
        return self.batch // (self.data * self.micro_batch)

    @property
    def flops(self) -> float:
        """FLOPs per iteration as the paper counts them (§5.1, recomputation included)."""
        s, h, l, v = SEQUENCE, self.hidden, self.layers, VOCAB
        return 96.0 * self.batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))

    @property
    def measured_time(self) -> float:
        return self.flops / (self.tflops_per_gpu * 1e12 * self.gpus)


def load_runs(path: Path = TABLE) -> list[Run]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        out = []
        for r in rows:
            layers, pipeline = int(r["layers"]), int(r["pipeline"])
            per = r["layers_per_virtual_stage"]
            virtual = layers // pipeline // int(per) if per else 1
            if r["ddp"] not in ("torch", "local"):
                raise ValueError(f"{path}: ddp {r['ddp']!r}, expected 'torch' or 'local'")
            out.append(Run(float(r["parameters"]), int(r["heads"]), int(r["hidden"]), layers, int(r["tensor"]),
                           pipeline, int(r["gpus"]), int(r["batch"]), float(r["tflops_per_gpu"]),
                           int(r["micro_batch"]), r["ddp"] == "torch", virtual))
        return out


def cluster(gpus: int) -> Topology:
    """The shipped DGX A100 node, as many as the run used (8 GPUs each)."""
    import fidelity     # here: fidelity.py imports this module

    return fidelity.nodes(NODE, gpus, "dgx-a100")


def model(run: Run) -> ModelSpec:
    """The run's GPT with its published training settings (see the data file)."""
    t = TransformerSpec(layers=run.layers, hidden=run.hidden, heads=run.heads, sequence=SEQUENCE, vocab=VOCAB)
    training = TrainingSpec(global_batch=run.batch, microbatches=run.microbatches,
                            dtype="float16", optimizer="adam", recompute="full", attention="materialized",
                            gradient_overlap=run.overlap,
                            # both DDPs of these runs add each micro-batch's weight gradients in a
                            # pass of its own: PyTorch's autograd into .grad, Megatron-LM's local DDP
                            # through .grad or a main_grad hook (fusion, we believe, came later)
                            gradient_accumulation="add")
    return ModelSpec(name=f"gpt-{run.parameters:g}b", transformer=t, training=training)


def split(run: Run) -> list[int]:
    per = [run.layers // run.pipeline] * run.pipeline
    per[0] += 1                      # the embedding
    per[-1] += 1                     # the logits
    return per


def interleaved(run: Run) -> float:
    """Simulated iteration of the run's interleaved 1F1B plan at its published chunk count:
    the uniform plan (:mod:`solver_planner.stages.uniform`: blocks shared equally over the
    ``pipeline x virtual`` chunks) on the run's mesh, configuration and micro-batches."""
    topo = cluster(run.gpus)
    config = Config(run.data, run.tensor, run.pipeline, run.microbatches)
    search = StageSearch(layer_model(model(run)), topo, "interleaved-1f1b", True, shapes=[shape_of(topo, config)],
                         tensor=run.tensor, microbatches=[run.microbatches])
    (pair,) = search.pairs()
    times = [simulate_schedule(plan, schedule).iteration_time
             for plan, schedule in uniform_plans(pair, ["interleaved-1f1b"]) if schedule.virtual == run.virtual]
    if len(times) != 1:
        raise ValueError(f"{run.parameters:g}B: {len(times)} interleaved plans with {run.virtual} chunks per device")
    return times[0]


def predict(run: Run) -> dict:
    t0 = time.perf_counter()
    k = run.microbatches
    if run.virtual > 1:
        seconds, compute = interleaved(run), "efficiency"
    else:
        rep = api.stages(cluster(run.gpus), model(run), schedule="1f1b",
                         config=Config(run.data, run.tensor, run.pipeline, k), split=split(run))
        seconds, compute = rep.run.iteration_time, rep.compute
    predicted = run.flops / (seconds * run.gpus) / 1e12
    schedule = f"interleaved v={run.virtual}" if run.virtual > 1 else "1f1b"
    return {"parameters": run.parameters, "gpus": run.gpus, "config": f"{run.data},{run.tensor},{run.pipeline},{k}",
            "micro_batch": run.micro_batch, "schedule": schedule, "overlap": run.overlap,
            "measured_tflops": run.tflops_per_gpu, "predicted_tflops": predicted,
            "measured_time": run.measured_time, "predicted_time": seconds,
            "error": predicted / run.tflops_per_gpu - 1, "compute": compute, "seconds": time.perf_counter() - t0}


def summary(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows]
    return {"runs": len(rows), "median_error": statistics.median(errors), "worst_error": max(errors),
            "spearman": spearman([r["predicted_tflops"] for r in rows], [r["measured_tflops"] for r in rows])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=None, help="comma-separated parameter counts (billions) of the runs to check")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = load_runs()
    if args.runs:
        wanted = {float(x) for x in args.runs.split(",")}
        runs = [r for r in runs if r.parameters in wanted]
    rows = []
    for r in runs:
        rows.append(predict(r))
        print(f"{r.parameters:g}B: {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    summ = summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ}, sys.stdout, indent=1)
        print()
        return 0
    print("Megatron-LM (Narayanan et al. 2021) Table 1 on DGX A100 (preset A100-SXM4-80GB), configurations fixed")
    print(f"{'params':>8} {'GPUs':>5} {'d,t,p,k':>14} {'micro':>5} {'schedule':>15} {'DDP':>5}"
          f" {'measured TF/GPU':>16} {'predicted':>10} {'error':>7}")
    for r in rows:
        print(f"{r['parameters']:>7g}B {r['gpus']:>5} {r['config']:>14} {r['micro_batch']:>5} {r['schedule']:>15}"
              f" {'torch' if r['overlap'] else 'local':>5} {r['measured_tflops']:>16.0f}"
              f" {r['predicted_tflops']:>10.1f} {r['error']:>+7.1%}")
    print(f"median |error| {summ['median_error']:.1%}, worst {summ['worst_error']:.1%}, Spearman {'n/a' if summ['spearman'] is None else format(summ['spearman'], '.2f')}"
          f" ({summ['runs']} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
