"""Predicted against measured: Megatron-Core's published GPT weak scaling on H100s.

Megatron-LM's README ("Performance Benchmarking", the model table of its weak-scaling
figure) publishes, for Megatron-Core r0.8.0, nine GPT models of 1.7 B to 462 B parameters
trained on 48 to 6 144 H100 GPUs with their tensor, pipeline and data-parallel sizes, global
batch and teraFLOP/s per GPU (``benchmarks/data/megatron_core_h100.csv``, with its source).
Each run is planned here under the Megatron-LM target (``api.stages(..., target="megatron")``,
the command's ``--target megatron``) with its configuration fixed, on the shipped DGX H100
nodes (``specs/clusters/dgx-h100-4x8.yaml``: preset H100-SXM5-80GB, one 400 Gb/s NIC per GPU,
as many nodes as the run used), with what the README and that release's code say:

* sequence 4 096, vocabulary 131 072, a GPT block (4h MLP, GELU, LayerNorm, learned
  positions: r0.8.0's default ``learned_absolute``), the embedding and the logits untied (the
  table's parameter counts; a test checks them), bf16;
* the overlaps the README lists: ``--overlap-grad-reduce`` and ``--overlap-param-gather``
  with Megatron's distributed optimizer (``optimizer_sharding: distributed`` and
  ``gradient_overlap``: gradients reduced during the last backward, the updated parameters
  gathered ahead of the next forward), and ``--tp-comm-overlap`` (``tensor_overlap``, which needs sequence parallelism, so
  ``sequence_parallel`` wherever the tensor size is above 1);
* r0.8.0's defaults, which are the target's: bf16 gradients accumulated and reduced in fp32
  (``arguments.py`` sets ``accumulate_allreduce_grads_in_fp32`` for bf16), gradient
  accumulation fusion (``gradient_accumulation: fused``), gradient buckets of max(40 M, 1 M x
  data size) parameters on the stage holding the first layer, and on every other the whole
  reduction after its last backward (Megatron-Core's one bucket)
  (``distributed_data_parallel.py``), FlashAttention;
* not published, assumed: micro-batches of one sample, no recomputation, plain 1F1B with the
  blocks split evenly (the first stages one more), the embedding on the first stage and the
  logits on the last.

Nothing is fitted to these runs.  Per run: measured and predicted teraFLOP/s per GPU (the
FLOPs Megatron-LM counts over the iteration time) and predicted / measured - 1; at the end the
median and worst absolute error and the Spearman rank correlation.  ``--no-overlap`` prices
the runs without ``tensor_overlap`` (the spec's default), to show what it changes;
``--ddp-buckets`` with PyTorch DDP's 25 MiB gradient buckets (the spec's default outside the
target) instead of r0.8.0's.

    python benchmarks/megatron_core_runs.py           # all nine runs (a few seconds)
    python benchmarks/megatron_core_runs.py --json
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner import api  # noqa: E402
from solver_planner.spec.layers import TrainingSpec, TransformerSpec  # noqa: E402
from solver_planner.spec.model import ModelSpec  # noqa: E402
from solver_planner.stages.report import Config  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "megatron_core_h100.csv"
NODE = ROOT / "specs" / "clusters" / "dgx-h100-4x8.yaml"
SEQUENCE, VOCAB = 4096, 131072
PEAK = 989e12                   # H100 SXM BF16 dense: the table's MFU is teraFLOP/s over it


@dataclass(frozen=True)
class Run:
    parameters: float
    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    data: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    mfu: float                  # percent, as the table rounds it

    @property
    def microbatches(self) -> int:
        return self.batch // self.data          # micro-batches of one sample per replica

    @property
    def flops(self) -> float:
        """FLOPs per iteration as Megatron-LM core_r0.8.0 counts them for this GPT
        (``num_floating_point_operations``): 12 B s l h^2 (2 + s / h + 4 + V / (2 l h))."""
        s, h, l, v = SEQUENCE, self.hidden, self.layers, VOCAB
        return 12.0 * self.batch * s * l * h * h * (2 + s / h + 4 + v / (2 * l * h))

    @property
    def measured_time(self) -> float:
        return self.flops / (self.tflops_per_gpu * 1e12 * self.gpus)


def load_runs(path: Path = TABLE) -> list[Run]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        out = []
        for r in rows:
            run = Run(float(r["parameters"]), *(int(r[k]) for k in ("heads", "hidden", "layers", "tensor", "pipeline",
                                                                      "data", "gpus", "batch")),
                      float(r["tflops_per_gpu"]), float(r["mfu"]))
            if run.tensor * run.pipeline * run.data != run.gpus or run.batch % run.data:
                raise ValueError(f"{path}: {r}: sizes do not multiply to the GPUs, or the batch does not split")
            out.append(run)
        return out


def cluster(gpus: int) -> Topology:
    """The shipped DGX H100 node, as many as the run used (8 GPUs each)."""
    return fidelity.nodes(NODE, gpus, "dgx-h100")


def model(run: Run, overlap: bool = True, megatron_buckets: bool = True) -> ModelSpec:
    """The run's GPT with the settings the module docstring lists."""
    t = TransformerSpec(layers=run.layers, hidden=run.hidden, heads=run.heads, sequence=SEQUENCE, vocab=VOCAB,
                        activation="gelu", position="learned", norm="layernorm")
    split_tensor = run.tensor > 1
    training = TrainingSpec(
        global_batch=run.batch, microbatches=run.microbatches, dtype="bfloat16", optimizer="adam", recompute="none",
        attention="flash", tied_embeddings=False, sequence_parallel=split_tensor,
        tensor_overlap=overlap and split_tensor, optimizer_sharding="distributed", gradient_overlap=True,
        gradient_accumulation="fused", gradient_reduce_dtype="float32",
        # unset, the target prices Megatron-Core's own buckets (stages/layers.py layer_model)
        **({} if megatron_buckets else {"gradient_bucket": 25 * 2**20}))
    return ModelSpec(name=f"gpt-{run.parameters:g}b", transformer=t, training=training)


def split(run: Run) -> list[int]:
    """Blocks per stage, the first stages one more where they do not divide, plus the
    embedding on the first stage and the logits on the last."""
    return fidelity.megatron_split(run.layers, run.pipeline)


def predict(run: Run, overlap: bool = True, megatron_buckets: bool = True) -> dict:
    t0 = time.perf_counter()
    rep = api.stages(cluster(run.gpus), model(run, overlap, megatron_buckets), schedule="1f1b",
                     config=Config(run.data, run.tensor, run.pipeline, run.microbatches), split=split(run),
                     target="megatron")
    seconds = rep.run.iteration_time
    predicted = run.flops / (seconds * run.gpus) / 1e12
    return {"parameters": run.parameters, "gpus": run.gpus,
            "config": f"{run.data},{run.tensor},{run.pipeline},{run.microbatches}",
            "measured_tflops": run.tflops_per_gpu, "predicted_tflops": predicted,
            "measured_time": run.measured_time, "predicted_time": seconds,
            "error": predicted / run.tflops_per_gpu - 1, "compute": rep.compute, "seconds": time.perf_counter() - t0}


def summary(rows: list[dict]) -> dict:
    """The fidelity table's row (benchmarks/fidelity.py)."""
    return fidelity.summary("Megatron-Core r0.8.0 on H100: TFLOP/s per GPU", [r["predicted_tflops"] for r in rows],
                            [r["measured_tflops"] for r in rows], note="nothing fitted")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-overlap", action="store_true",
                    help="without tensor_overlap (the spec's default)")
    ap.add_argument("--ddp-buckets", action="store_true",
                    help="PyTorch DDP's 25 MiB gradient buckets (the spec's default) instead of r0.8.0's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [predict(r, not args.no_overlap, not args.ddp_buckets) for r in load_runs()]
    summ = summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ}, sys.stdout, indent=1)
        print()
        return 0
    print("Megatron-Core r0.8.0 weak scaling on DGX H100 (preset H100-SXM5-80GB), configurations fixed"
          + (", no tensor_overlap" if args.no_overlap else "") + (", 25 MiB buckets" if args.ddp_buckets else ""))
    print(f"{'params':>7} {'GPUs':>5} {'d,t,p,k':>14} {'measured TF/GPU':>16} {'predicted':>10} {'error':>7}")
    for r in rows:
        print(f"{r['parameters']:>6g}B {r['gpus']:>5} {r['config']:>14} {r['measured_tflops']:>16.1f}"
              f" {r['predicted_tflops']:>10.1f} {r['error']:>+7.1%}")
    print(fidelity.summary_line(summ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
