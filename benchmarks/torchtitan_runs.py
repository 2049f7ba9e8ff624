"""Predicted against measured: torchtitan's published Llama runs with FSDP2 on 64 A100s.

torchtitan (PyTorch's own pre-training stack) publishes, for Llama 3 8B and 70B and Llama 2
13B and 70B trained with FSDP2 alone on 64 A100 80 GB GPUs, the tokens per second per GPU
it measured (``benchmarks/data/torchtitan_a100.csv``, with its source).  Each run is
planned here with its published configuration fixed: 64 data-parallel replicas with every
parameter, gradient and optimizer state sharded (``optimizer_sharding: zero-3``, FSDP's
full sharding), one micro-batch of the local batch, bf16 with AdamW, FlashAttention
(PyTorch's SDPA), gradients reduced while backward goes on, on the shipped DGX A100 nodes
(``specs/clusters/dgx-a100-8x8.yaml``, preset A100-SXM4-80GB; torchtitan does not say how
its hosts are connected, so the DGX's eight 200 Gb/s HDR links per node are an assumption).
The model shapes are Llama 2's (Touvron et al. 2023, Table 1 and its released configs) and
Llama 3's (Llama Team 2024, Table 3).  Nothing is fitted to these runs.

Checkpointing: ``no``, ``full`` and ``selective op`` are our ``recompute: none``, ``full``
and ``selective-op`` (torchtitan's per-operator checkpointing: every second matrix product
of a block and the element-wise operators re-run).  torchtitan's Llama of that time ran the
query, key and value projections as three products (``fused_qkv: false``; 0.3.0 fuses
them), so selective-op re-runs the key projection too.  'selective layer' (every second
block checkpointed, a mode torchtitan 0.3.0 no longer has) has no counterpart here: for
those rows the prediction is the range between no and full recomputation, and the summary
(median and worst error, Spearman) is over the rows priced exactly.

Gradients are reduced in fp32 (``gradient_reduce_dtype: float32``: torchtitan's FSDP2 mixed
precision reduces in float32), twice the bytes of a bf16 reduce-scatter.  Data loading and
logging get the default per-iteration host overhead, as in the Megatron-LM comparison
(`benchmarks/published_runs.py`).

    python benchmarks/torchtitan_runs.py            # all eight rows (a few seconds)
    python benchmarks/torchtitan_runs.py --json
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
from solver_planner.errors import InfeasibleError  # noqa: E402
from solver_planner.spec.layers import TrainingSpec, TransformerSpec  # noqa: E402
from solver_planner.spec.model import ModelSpec  # noqa: E402
from solver_planner.stages.report import Config  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import published_runs  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "torchtitan_a100.csv"
GPUS = 64
# (layers, hidden, heads, key/value heads, MLP width, vocabulary, sequence)
SHAPES = {
    "llama2-13b": (40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000, 4096),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192),
}
EXACT = {"no": "none", "full": "full", "selective op": "selective-op"}


@dataclass(frozen=True)
class Run:
    model: str
    local_batch: int
    checkpointing: str
    wps: float                      # measured tokens per second per GPU
    mfu: float

    @property
    def label(self) -> str:
        return f"{self.model} b={self.local_batch} {self.checkpointing}"


def load_runs(path: Path = TABLE) -> list[Run]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [Run(r["model"], int(r["local_batch"]), r["checkpointing"], float(r["wps"]), float(r["mfu"]))
                for r in rows]


def cluster() -> Topology:
    """The shipped DGX A100 nodes, eight of them (64 GPUs), as the Megatron-LM comparison
    builds them."""
    return published_runs.cluster(GPUS)


def model(run: Run, recompute: str) -> ModelSpec:
    layers, hidden, heads, kv, ffn, vocab, seq = SHAPES[run.model]
    t = TransformerSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn, vocab=vocab,
                        sequence=seq, activation="swiglu", position="rotary", norm="rmsnorm", bias=False,
                        fused_qkv=False)
    training = TrainingSpec(global_batch=run.local_batch * GPUS, microbatches=1, dtype="bfloat16", optimizer="adam",
                            optimizer_sharding="zero-3", recompute=recompute, attention="flash",
                            gradient_reduce_dtype="float32",
                            tied_embeddings=False, gradient_overlap=True)
    return ModelSpec(name=run.model, transformer=t, training=training)


def tokens_per_gpu(run: Run, recompute: str, topo: Topology) -> float | None:
    """Predicted tokens per second per GPU; None when our memory model says it does not fit."""
    seq = SHAPES[run.model][6]
    try:
        rep = api.stages(topo, model(run, recompute), schedule="1f1b", config=Config(GPUS, 1, 1, 1))
    except InfeasibleError:
        return None
    return run.local_batch * seq / rep.run.iteration_time


def predict(run: Run, topo: Topology) -> dict:
    t0 = time.perf_counter()
    out = {"model": run.model, "local_batch": run.local_batch, "checkpointing": run.checkpointing,
           "measured_wps": run.wps}
    if run.checkpointing in EXACT:
        wps = tokens_per_gpu(run, EXACT[run.checkpointing], topo)
        out.update(predicted_wps=wps, error=None if wps is None else wps / run.wps - 1, exact=True)
    else:
        lo, hi = tokens_per_gpu(run, "full", topo), tokens_per_gpu(run, "none", topo)
        out.update(predicted_range=[lo, hi], exact=False,
                   within=None if lo is None or hi is None else lo <= run.wps <= hi)
    out["seconds"] = time.perf_counter() - t0
    return out


def summary(rows: list[dict]) -> dict:
    exact = [r for r in rows if r["exact"] and r["predicted_wps"] is not None]
    errors = [abs(r["error"]) for r in exact]
    return {"exact_rows": len(exact), "median_error": statistics.median(errors) if errors else None,
            "worst_error": max(errors) if errors else None,
            "spearman": spearman([r["predicted_wps"] for r in exact], [r["measured_wps"] for r in exact])
            if len(exact) >= 3 else None,
            "ranged_rows": sum(not r["exact"] for r in rows),
            "measured_within_range": sum(bool(r.get("within")) for r in rows if not r["exact"])}


def _wps(x: float | None) -> str:
    return "does not fit" if x is None else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    topo = cluster()
    rows = []
    for run in load_runs():
        rows.append(predict(run, topo))
        print(f"{run.label}: {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    summ = summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ}, sys.stdout, indent=1)
        print()
        return 0
    print("torchtitan, Llama with FSDP2 on 64 A100 80 GB (docs/performance.md), configurations fixed;"
          " tokens/s per GPU")
    print(f"{'model':<11} {'local batch':>11} {'checkpointing':<16} {'measured':>9} {'predicted':>31} {'error':>7}")
    for r in rows:
        if r["exact"]:
            pred = _wps(r["predicted_wps"])
            err = "" if r["error"] is None else f"{r['error']:+.1%}"
        else:
            lo, hi = r["predicted_range"]
            pred = f"{_wps(lo)} (full) - {_wps(hi)} (none)" if hi is not None else f"{_wps(lo)} (full); none does not fit"
            err = {True: "within", False: "outside", None: "-"}[r["within"]]
        print(f"{r['model']:<11} {r['local_batch']:>11} {r['checkpointing']:<16} {r['measured_wps']:>9,.0f}"
              f" {pred:>31} {err:>7}")
    rho = summ["spearman"]
    print(f"rows priced exactly: {summ['exact_rows']}, median |error| "
          f"{'n/a' if summ['median_error'] is None else format(summ['median_error'], '.1%')}, worst "
          f"{'n/a' if summ['worst_error'] is None else format(summ['worst_error'], '.1%')}, Spearman "
          f"{'n/a' if rho is None else format(rho, '.2f')}; 'selective layer' rows whose measured throughput"
          f" lies between our full and no recomputation: {summ['measured_within_range']} of {summ['ranged_rows']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
