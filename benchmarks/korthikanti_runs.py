"""Predicted against measured: Korthikanti et al. 2022's end-to-end GPT iterations on A100s.

The paper that introduced selective recomputation and sequence parallelism ("Reducing
Activation Recomputation in Large Transformer Models", Table 5) times one training iteration
of GPT models of 22 B, 175 B, 530 B and 1 T parameters on 8 to 512 A100s, each with full
recomputation and with its two techniques (``benchmarks/data/korthikanti_table5.csv``, with
the configurations of its Table 3).  Each of the eight runs is planned here with its
configuration fixed: tensor and pipeline sizes, data-parallel size 1, the micro-batch,
blocks split evenly (the first stages take one more where they do not divide) with the
embedding on the first stage and the logits on the last, plain 1F1B, attention not fused,
and ``recompute: full`` or ``recompute: selective`` with ``sequence_parallel``; on the
shipped DGX A100 nodes (``specs/clusters/dgx-a100-8x8.yaml``'s node, preset A100-SXM4-80GB,
as many nodes as the run used).  Nothing is fitted to these runs.  The A100 presets' GEMM
efficiency is fitted to the same paper's Table 4, one layer of the 22 B model
(``benchmarks/data/layer_times_a100.csv``), so the 22 B rows are partly in sample; the
larger models' layers are not.

Per run: measured and predicted iteration time, and predicted / measured - 1 of the
throughput (measured / predicted time - 1).  At the end: median and worst absolute error and
the Spearman rank correlation of the predicted with the measured throughput per GPU.

    python benchmarks/korthikanti_runs.py           # all eight runs (a few seconds)
    python benchmarks/korthikanti_runs.py --json
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

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity  # noqa: E402
from published_runs import SEQUENCE, VOCAB, cluster  # noqa: E402

TABLE = ROOT / "benchmarks" / "data" / "korthikanti_table5.csv"
MODES = {"full": ("full", False), "present": ("selective", True)}    # (recompute, sequence parallelism)


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
    micro_batch: int
    mode: str                       # 'full' (full recomputation) or 'present' (selective + sequence parallel)
    seconds: float                  # the measured iteration

    @property
    def microbatches(self) -> int:
        return self.batch // self.micro_batch

    @property
    def model_flops(self) -> float:
        """The paper's model FLOPs per iteration (no recomputation): 72 B s l h^2 (1 + s/6h + V/16lh)."""
        s, h, l, v = SEQUENCE, self.hidden, self.layers, VOCAB
        return 72.0 * self.batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def load_runs(path: Path = TABLE) -> list[Run]:
    with open(path, encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        out = []
        for r in rows:
            shape = (float(r["parameters"]), int(r["heads"]), int(r["hidden"]), int(r["layers"]), int(r["tensor"]),
                     int(r["pipeline"]), int(r["gpus"]), int(r["batch"]), int(r["micro_batch"]))
            if shape[4] * shape[5] != shape[6]:
                raise ValueError(f"{path}: {r['parameters']}B: tensor x pipeline is not the GPU count (data size 1)")
            out.append(Run(*shape, "full", float(r["full_recompute_s"])))
            out.append(Run(*shape, "present", float(r["present_work_s"])))
        return out


def model(run: Run) -> ModelSpec:
    recompute, sequence_parallel = MODES[run.mode]
    t = TransformerSpec(layers=run.layers, hidden=run.hidden, heads=run.heads, sequence=SEQUENCE, vocab=VOCAB)
    training = TrainingSpec(global_batch=run.batch, microbatches=run.microbatches, dtype="float16", optimizer="adam",
                            recompute=recompute, sequence_parallel=sequence_parallel, attention="materialized",
                            gradient_accumulation="add")
    return ModelSpec(name=f"gpt-{run.parameters:g}b", transformer=t, training=training)


def split(run: Run) -> list[int]:
    """Blocks per stage, the first stages one more where they do not divide, plus the
    embedding on the first stage and the logits on the last."""
    return fidelity.megatron_split(run.layers, run.pipeline)


def predict(run: Run) -> dict:
    t0 = time.perf_counter()
    rep = api.stages(cluster(run.gpus), model(run), schedule="1f1b",
                     config=Config(1, run.tensor, run.pipeline, run.microbatches), split=split(run))
    seconds = rep.run.iteration_time
    return {"parameters": run.parameters, "gpus": run.gpus, "mode": run.mode,
            "config": f"1,{run.tensor},{run.pipeline},{run.microbatches}", "micro_batch": run.micro_batch,
            "measured_time": run.seconds, "predicted_time": seconds,
            "measured_mfu": run.model_flops / (run.seconds * run.gpus * 312e12),
            "predicted_mfu": run.model_flops / (seconds * run.gpus * 312e12),
            "error": run.seconds / seconds - 1, "compute": rep.compute, "seconds": time.perf_counter() - t0}


def summary(rows: list[dict]) -> dict:
    """The fidelity table's row (benchmarks/fidelity.py): errors, Spearman and the rest of MFU."""
    return fidelity.summary("Korthikanti et al. 2022 Table 5: MFU", [r["predicted_mfu"] for r in rows],
                            [r["measured_mfu"] for r in rows], note="nothing fitted; the 22B layer is Table 4's")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [predict(r) for r in load_runs()]
    summ = summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ}, sys.stdout, indent=1)
        print()
        return 0
    print("Korthikanti et al. 2022 Table 5 on DGX A100 (preset A100-SXM4-80GB), configurations fixed, data size 1")
    print(f"{'params':>7} {'GPUs':>5} {'d,t,p,k':>12} {'micro':>5} {'recomputation':>30} {'measured':>9}"
          f" {'predicted':>9} {'MFU meas':>8} {'pred':>6} {'error':>7}")
    for r in rows:
        what = "full" if r["mode"] == "full" else "selective + sequence parallel"
        print(f"{r['parameters']:>6g}B {r['gpus']:>5} {r['config']:>12} {r['micro_batch']:>5} {what:>30}"
              f" {r['measured_time']:>8.2f}s {r['predicted_time']:>8.2f}s {r['measured_mfu']:>8.1%}"
              f" {r['predicted_mfu']:>6.1%} {r['error']:>+7.1%}")
    print(fidelity.summary_line(summ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
