"""Predicted against measured: MosaicML's published MPT training throughput on A100 and H100.

MosaicML publishes the tokens per second per GPU it measured training its MPT models (125M
to 70B parameters, sequences of 512 to 65 536 tokens) with PyTorch FSDP on 8 to 64 A100 80GB
and H100 80GB GPUs (``benchmarks/data/mosaicml_mpt.csv``, with its source): the same
software on both, so the two GPUs are compared on equal terms.  Each run is planned here
with its published configuration fixed: every GPU one data-parallel replica with everything
sharded (``optimizer_sharding: zero-3``, FSDP's FULL_SHARD), the published micro-batch and
gradient accumulation, bf16 with gradients reduced in fp32 (Composer's DEFAULT precision) or
in bf16 (PURE), whole blocks recomputed or none, FlashAttention, gradients reduced while
backward goes on; on the shipped nodes (``specs/clusters/dgx-a100-8x8.yaml`` and
``dgx-h100-4x8.yaml``: the presets A100-SXM4-80GB and H100-SXM5-80GB, as many nodes as the
run used).  The MPT shapes are llm-foundry's (d_model, heads, layers; MLP expansion 4, GELU,
no biases, the embedding tied to the logits, vocabulary 50 368); ALiBi's positions are
priced as rotary ones (no parameters; a few element-wise passes), and its LayerNorm with a
bias.  The parameter counts match the table's within 0.6% (a test checks them; the table's
also hold a position table of sequence x d_model, which ALiBi does not read).  Nothing is
fitted to these runs.

Per data set (one per GPU): median and worst |predicted / measured - 1|, Spearman, and the
median measured / predicted; ``--rows`` prints each run.

    python benchmarks/mosaicml_runs.py              # both GPUs (a few seconds)
    python benchmarks/mosaicml_runs.py --gpu h100_80gb --rows
    python benchmarks/mosaicml_runs.py --json
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
from solver_planner.errors import InfeasibleError  # noqa: E402
from solver_planner.spec.layers import TrainingSpec, TransformerSpec  # noqa: E402
from solver_planner.spec.model import ModelSpec  # noqa: E402
from solver_planner.stages.report import Config  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "mosaicml_mpt.csv"
NODES = {"a100_80gb": ROOT / "specs" / "clusters" / "dgx-a100-8x8.yaml",
         "h100_80gb": ROOT / "specs" / "clusters" / "dgx-h100-4x8.yaml"}
PEAK = {"a100_80gb": 312e12, "h100_80gb": 989e12}       # the peaks MosaicML's MFU divides by
VOCAB = 50368
# llm-foundry's MPT yamls: (layers, d_model, heads)
SHAPES = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
          "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 64),
          "70b": (80, 8192, 64)}


@dataclass(frozen=True)
class Run:
    model: str
    seq: int
    gpus: int
    gpu: str
    mfu: float                  # percent, as MosaicML counts it
    micro_batch: int
    grad_accum: int
    global_batch: int
    tokens_per_gpu: float
    pure: bool                  # bf16 PURE: gradients reduced in bf16 (DEFAULT: in fp32)
    checkpointing: bool
    params: int

    @property
    def label(self) -> str:
        return f"{self.model} s={self.seq} {self.gpus}x{self.gpu}"


def load_runs(path: Path = TABLE) -> list[Run]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        out = []
        for r in rows:
            if r["mp_mode"] not in ("DEFAULT", "PURE") or r["checkpointing"] not in ("True", "False"):
                raise ValueError(f"{path}: {r}")
            out.append(Run(r["model"], int(r["seq"]), int(r["gpus"]), r["gpu"], float(r["mfu"]), int(r["micro_batch"]),
                           int(r["grad_accum"]), int(r["global_batch"]), float(r["tokens_per_gpu"]),
                           r["mp_mode"] == "PURE", r["checkpointing"] == "True", int(r["params"])))
        return out


def cluster(gpu: str, gpus: int) -> Topology:
    """The shipped node of that GPU, as many as the run used (8 GPUs each)."""
    return fidelity.nodes(NODES[gpu], gpus, gpu)


def model(run: Run) -> ModelSpec:
    layers, hidden, heads = SHAPES[run.model]
    t = TransformerSpec(layers=layers, hidden=hidden, heads=heads, sequence=run.seq, vocab=VOCAB, activation="gelu",
                        position="rotary", norm="layernorm", bias=False)
    training = TrainingSpec(global_batch=run.global_batch, microbatches=run.grad_accum, dtype="bfloat16",
                            optimizer="adam", optimizer_sharding="zero-3",
                            recompute="full" if run.checkpointing else "none", attention="flash",
                            gradient_reduce_dtype="bfloat16" if run.pure else "float32", tied_embeddings=True,
                            gradient_overlap=True)
    return ModelSpec(name=f"mpt-{run.model}", transformer=t, training=training)


def predict(run: Run) -> dict:
    t0 = time.perf_counter()
    out = {"model": run.model, "seq": run.seq, "gpus": run.gpus, "gpu": run.gpu, "checkpointing": run.checkpointing,
           "measured": run.tokens_per_gpu}
    try:
        rep = api.stages(cluster(run.gpu, run.gpus), model(run), schedule="1f1b",
                         config=Config(run.gpus, 1, 1, run.grad_accum))
    except InfeasibleError as exc:          # our memory model refuses it
        out.update(predicted=None, error=None, refused=str(exc))
    else:
        tokens = run.global_batch * run.seq / rep.run.iteration_time / run.gpus
        out.update(predicted=tokens, error=tokens / run.tokens_per_gpu - 1)
    out["seconds"] = time.perf_counter() - t0
    return out


def summary(rows: list[dict]) -> dict:
    """The fidelity table's row of one GPU's runs (benchmarks/fidelity.py), over the runs priced."""
    priced = [r for r in rows if r["predicted"] is not None]
    return fidelity.summary(f"MosaicML MPT, FSDP on {rows[0]['gpu']}: tokens/s per GPU",
                            [r["predicted"] for r in priced], [r["measured"] for r in priced],
                            note="nothing fitted", runs=len(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", choices=sorted(NODES), action="append", help="only these GPUs' rows (default: both)")
    ap.add_argument("--rows", action="store_true", help="print every run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = [r for r in load_runs() if args.gpu is None or r.gpu in args.gpu]
    rows = [predict(r) for r in runs]
    gpus = sorted({r["gpu"] for r in rows})
    summaries = {g: summary([r for r in rows if r["gpu"] == g]) for g in gpus}
    if args.json:
        json.dump({"rows": rows, "summary": summaries}, sys.stdout, indent=1)
        print()
        return 0
    if args.rows:
        print(f"{'run':<26} {'ckpt':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
        for r in rows:
            pred = "refused" if r["predicted"] is None else f"{r['predicted']:.0f}"
            err = "" if r["error"] is None else f"{r['error']:+.1%}"
            print(f"{r['model'] + ' s=' + str(r['seq']) + ' ' + str(r['gpus']) + 'x' + r['gpu']:<26}"
                  f" {'full' if r['checkpointing'] else 'none':>5} {r['measured']:>9.0f} {pred:>9} {err:>7}")
    print("MosaicML MPT with FSDP, tokens/s per GPU, configurations fixed (shipped DGX specs, presets)")
    for g, s in summaries.items():
        print(f"{g}: {s['pairs']} of {s['runs']} runs priced, median |error| {s['median_error']:.1%}, worst"
              f" {s['worst_error']:.1%}, Spearman {s['spearman']:.3f}, measured / predicted"
              f" {s['median_measured_over_predicted']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
