"""DistIR Table 2 reproduced: the D/T/P/K grid search on MLP training.

For each MLP of DistIR Table 1 (specs/models/mlp-{1b,17b,103b}.yaml) and each global batch
of Table 2, on one DGX-2 (specs/clusters/dgx-v100-16.yaml), the grid of DistIR §5.1: data,
tensor and pipeline degrees D, T, P, powers of two with D x T x P = 16; K = 1 micro-batch
when P = 1, else K in {2, 4, ..., 128} such that K divides the batch and every replica's
micro-batch holds at least one sample.  Layers are cut uniformly into P stages and run with
synchronous 1F1B (DistIR §4).  Each configuration is one call of the stage planner with
that configuration fixed (``api.stages(..., config=(D, T, P, K), split=uniform,
schedule="1f1b")``); configurations that do not fit in device memory (our memory model) are
dropped, as §5.2 does with DistIR's.

Per row: our best configuration next to the paper's, and our predicted speedup of it over
pure data (16/1/1/1), pure tensor (1/16/1/1) and pure pipeline (1/1/16/128, the paper's
K = 8P baseline) parallelism next to the measured ones ('-': the baseline does not fit).
At the end, the agreement: rows with the same best configuration; rows with the same
fastest pure strategy (among the baselines that fit in both); the Spearman rank
correlation of our speedups with the measured ones; cells whose fit ('-' or not) differs.

    python benchmarks/distir_grid.py                      # all 27 rows (about a minute)
    python benchmarks/distir_grid.py --quick              # the smallest batch of each model
    python benchmarks/distir_grid.py --models mlp-1b --batches 128,4096 --json
    python benchmarks/distir_grid.py --compute peak       # FLOPs at the peak rate
    python benchmarks/distir_grid.py --cluster specs/clusters/dgx2-datasheet.yaml   # datasheets + preset
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solver_planner import api  # noqa: E402
from solver_planner.agreement import pairwise_agreement, spearman  # noqa: E402
from solver_planner.errors import InfeasibleError  # noqa: E402
from solver_planner.spec import load_cluster_spec  # noqa: E402
from solver_planner.spec.model import ModelSpec, load_model_spec  # noqa: E402
from solver_planner.stages.report import Config  # noqa: E402
from solver_planner.topology import Topology  # noqa: E402

CLUSTER = ROOT / "specs" / "clusters" / "dgx-v100-16.yaml"
MODELS = {name: ROOT / "specs" / "models" / f"{name}.yaml" for name in ("mlp-1b", "mlp-17b", "mlp-103b")}
TABLE2 = ROOT / "benchmarks" / "data" / "distir_table2.csv"
DEVICES = 16
MICROBATCHES = tuple(2**i for i in range(1, 8))        # DistIR §5.1: 2 to 128
BASELINES = {"data": Config(16, 1, 1, 1), "tensor": Config(1, 16, 1, 1), "pipeline": Config(1, 1, 16, 128)}
COMPUTE_MODELS = ("efficiency", "roofline", "peak")


# -- the paper's table ---------------------------------------------------------------------

@dataclass(frozen=True)
class PaperRow:
    """One row of DistIR Table 2; a speedup is None where the paper prints '-'."""

    model: str
    batch: int
    best: Config
    speedup: dict[str, float | None]


def parse_config(text: str) -> Config:
    """``'4/2/2/32'`` (D / T / P / K)."""
    return Config(*(int(x) for x in text.split("/")))


def fmt_config(cfg: Config | None) -> str:
    return "-" if cfg is None else f"{cfg.data}/{cfg.tensor}/{cfg.pipeline}/{cfg.microbatches}"


def load_table(path: Path = TABLE2) -> list[PaperRow]:
    """The rows of ``benchmarks/data/distir_table2.csv`` (lines starting with '#' are comments)."""
    with open(path, encoding="utf-8") as f:
        reader = csv.DictReader(line for line in f if not line.startswith("#"))
        return [PaperRow(r["model"], int(r["batch"]), parse_config(r["best"]),
                         {k: None if r[f"vs_{k[0]}"] == "-" else float(r[f"vs_{k[0]}"]) for k in BASELINES})
                for r in reader]


# -- the grid ------------------------------------------------------------------------------

def grid(batch: int, devices: int = DEVICES, layers: int | None = None) -> list[Config]:
    """DistIR §5.1's configurations for one global batch: D, T, P powers of two with
    D x T x P = ``devices``; K = 1 when P = 1, else K in 2..128 dividing the batch with at
    least one sample per replica and micro-batch; P dividing ``layers`` (uniform stages)."""
    powers = [2**i for i in range(int(math.log2(devices)) + 1)]
    out = []
    for p in powers:
        if layers is not None and layers % p:
            continue
        for t in powers:
            if devices % (t * p):
                continue
            d = devices // (t * p)
            for k in ((1,) if p == 1 else MICROBATCHES):
                if batch % (d * k) == 0:      # powers of two: the same as batch / (d k) >= 1
                    out.append(Config(d, t, p, k))
    return out


# -- evaluation ----------------------------------------------------------------------------

@dataclass
class Outcome:
    """One configuration's simulated iteration, or why it does not fit."""

    config: Config
    time: float | None = None          # seconds per iteration; None: does not fit
    memory: float | None = None        # peak bytes on the fullest device
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.time is not None


def with_batch(spec: ModelSpec, batch: int) -> ModelSpec:
    """The model with another global batch (no file written, nothing re-validated: the spec
    limit is 2^20 and every Table 2 batch is a power of two below it)."""
    return spec.model_copy(update={"training": spec.training.model_copy(update={"global_batch": batch})})


def compute_kwargs(compute: str) -> dict:
    """``compute=`` for ``api.stages`` when it takes one; without it only the peak model exists."""
    if "compute" in inspect.signature(api.stages).parameters:
        return {"compute": compute}
    if compute != "peak":
        raise SystemExit(f"--compute {compute}: this solver_planner's api.stages has no compute= option yet (only"
                         " the peak-rate model exists); run with --compute peak")
    return {}


def evaluate(topo: Topology, spec: ModelSpec, cfg: Config, compute: str) -> tuple[Outcome, str]:
    """Simulate ``cfg`` on uniform stages with 1F1B; also the compute model the planner used."""
    layers = sum(layer.repeat for layer in spec.layers)
    split = [layers // cfg.pipeline] * cfg.pipeline
    try:
        rep = api.stages(topo, spec, schedule="1f1b", config=cfg, split=split, **compute_kwargs(compute))
    except InfeasibleError as exc:
        return Outcome(cfg, reason=str(exc)), ""
    return Outcome(cfg, rep.run.iteration_time, max(rep.run.peak_memory)), getattr(rep, "compute", "peak")


@dataclass
class Row:
    """Our answer for one (model, batch) next to the paper's."""

    paper: PaperRow
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    compute_used: str = ""

    def outcome(self, cfg: Config) -> Outcome | None:
        return next((o for o in self.outcomes if o.config == cfg), None)

    @property
    def best(self) -> Outcome | None:
        fitting = [o for o in self.outcomes if o.fits]
        return min(fitting, key=lambda o: o.time) if fitting else None   # first of equals: grid order

    def speedup(self, name: str) -> float | None:
        """Our best over baseline ``name`` (throughput ratio); None when it does not fit."""
        base, best = self.outcome(BASELINES[name]), self.best
        if base is None or not base.fits or best is None:
            return None
        return base.time / best.time

    def paper_best_slowdown(self) -> float | None:
        """How much slower the paper's best configuration is than ours, in our model."""
        o, best = self.outcome(self.paper.best), self.best
        return None if o is None or not o.fits or best is None else o.time / best.time

    def as_dict(self) -> dict:
        best = self.best
        return {
            "model": self.paper.model, "batch": self.paper.batch,
            "best": {"ours": fmt_config(best.config if best else None), "paper": fmt_config(self.paper.best)},
            "speedup": {k: {"ours": self.speedup(k), "paper": self.paper.speedup[k]} for k in BASELINES},
            "paper_best_slowdown_in_ours": self.paper_best_slowdown(),
            "configs": len(self.outcomes), "fitting": sum(o.fits for o in self.outcomes),
            "best_iteration_time": best.time if best else None,
            "best_throughput": self.paper.batch / best.time if best else None,
            "best_memory": best.memory if best else None,
            "outcomes": [{"config": fmt_config(o.config), "iteration_time": o.time, "memory": o.memory,
                          **({"reason": o.reason} if o.reason else {})} for o in self.outcomes],
            "seconds": self.seconds,
        }


def run_row(topo: Topology, spec: ModelSpec, paper: PaperRow, compute: str) -> Row:
    t0 = time.perf_counter()
    model = with_batch(spec, paper.batch)
    layers = sum(layer.repeat for layer in spec.layers)
    configs = grid(paper.batch, topo.num_devices, layers)
    row = Row(paper)
    for cfg in configs:
        outcome, used = evaluate(topo, model, cfg, compute)
        row.outcomes.append(outcome)
        row.compute_used = row.compute_used or used
    row.seconds = time.perf_counter() - t0
    return row


# -- agreement -----------------------------------------------------------------------------

def pure_winners(speedups: dict[str, float | None], among: list[str], digits: int | None = None) -> set[str]:
    """The fastest pure strategies among ``among``: least speedup of the best over them.
    ``digits``: compare at that printed precision (the paper's speedups are printed to 0.1x,
    so its ties at that precision all win; ours are compared exactly)."""
    key = (lambda k: round(speedups[k], digits)) if digits is not None else (lambda k: speedups[k])
    least = min(key(k) for k in among)
    return {k for k in among if key(k) == least}


def agreement(rows: list[Row]) -> dict:
    same_best = [r for r in rows if r.best is not None and r.best.config == r.paper.best]
    winner_rows = same_winner = 0
    fit_cells = fit_mismatch = 0
    ours_s, paper_s = [], []
    for r in rows:
        ours = {k: r.speedup(k) for k in BASELINES}
        both = [k for k in BASELINES if ours[k] is not None and r.paper.speedup[k] is not None]
        for k in BASELINES:
            fit_cells += 1
            fit_mismatch += (ours[k] is None) != (r.paper.speedup[k] is None)
        for k in both:
            ours_s.append(ours[k])
            paper_s.append(r.paper.speedup[k])
        if len(both) >= 2:
            winner_rows += 1
            same_winner += bool(pure_winners(ours, both) & pure_winners(r.paper.speedup, both, 1))
    rho = spearman(ours_s, paper_s)
    pairs = pairwise_agreement(ours_s, paper_s, tolerance=0.05)
    return {
        "rows": len(rows),
        "same_best": len(same_best), "same_best_fraction": len(same_best) / len(rows) if rows else None,
        "winner_rows": winner_rows, "same_pure_winner": same_winner,
        "same_pure_winner_fraction": same_winner / winner_rows if winner_rows else None,
        "spearman": rho, "spearman_pairs": len(ours_s), "pairwise_order_agreement": pairs,
        "fit_cells": fit_cells, "fit_mismatches": fit_mismatch,
    }


# -- output --------------------------------------------------------------------------------

def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def print_table(rows: list[Row], agree: dict, compute: str, seconds: float, cluster: Path = CLUSTER) -> None:
    used = sorted({r.compute_used for r in rows if r.compute_used}) or [compute]
    print(f"DistIR Table 2 on {cluster.name}, 1F1B on uniform stages, compute model: {', '.join(used)}")
    print("speedup of the best configuration over each pure strategy: ours / paper ('-': does not fit)")
    head = (f"{'model':<9}{'batch':>7}  {'best (ours)':<12}{'best (paper)':<13}{'vs D':>13}{'vs T':>13}{'vs P':>14}"
            f"  {'fit':>6}  {'paper best in ours':>18}")
    print(head)
    print("-" * len(head))
    for r in rows:
        best = r.best
        cells = "".join(f"{_x(r.speedup(k)) + ' / ' + _x(r.paper.speedup[k]):>{13 if k != 'pipeline' else 14}}"
                        for k in BASELINES)
        slow = r.paper_best_slowdown()
        mark = "=" if best is not None and best.config == r.paper.best else " "
        print(f"{r.paper.model:<9}{r.paper.batch:>7}  {fmt_config(best.config if best else None):<11}{mark}"
              f"{fmt_config(r.paper.best):<13}{cells}  {sum(o.fits for o in r.outcomes):>2}/{len(r.outcomes):<3}"
              f"  {('-' if slow is None else f'{slow:.2f}x slower'):>18}")
    print()
    n = agree["rows"]
    print(f"same best configuration: {agree['same_best']}/{n}"
          + (f" ({agree['same_best_fraction']:.0%})" if n else ""))
    if agree["winner_rows"]:
        print(f"same fastest pure strategy (rows where >= 2 baselines fit in both): {agree['same_pure_winner']}/"
              f"{agree['winner_rows']} ({agree['same_pure_winner_fraction']:.0%})")
    rho = agree["spearman"]
    print(f"Spearman rank correlation of predicted vs measured speedups: "
          f"{'n/a' if rho is None else f'{rho:.3f}'} over {agree['spearman_pairs']} pairs")
    pw = agree["pairwise_order_agreement"]
    print(f"pairs of those speedups ordered as measured (measured 5% apart or more): "
          f"{'n/a' if pw is None else f'{pw:.0%}'}")
    print(f"baseline cells whose fit differs from the paper's: {agree['fit_mismatches']}/{agree['fit_cells']}")
    print(f"({sum(len(r.outcomes) for r in rows)} configurations simulated in {seconds:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    parser.add_argument("--batches", default=None, help="comma-separated global batches (default: Table 2's)")
    parser.add_argument("--quick", action="store_true", help="only the smallest Table 2 batch of each model")
    parser.add_argument("--compute", default="efficiency", choices=COMPUTE_MODELS,
                        help="compute model of the stage planner (default efficiency)")
    parser.add_argument("--cluster", type=Path, default=CLUSTER, help=f"cluster spec (default {CLUSTER.name})")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    args = parser.parse_args(argv)

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; expected some of {', '.join(MODELS)}")
    compute_kwargs(args.compute)       # fail before any work when the option cannot run
    table = [r for r in load_table() if r.model in models]
    if args.batches:
        wanted = {int(b) for b in args.batches.split(",")}
        missing = wanted - {r.batch for r in table}
        if missing:
            parser.error(f"batch(es) {sorted(missing)} are not in Table 2 for {', '.join(models)}")
        table = [r for r in table if r.batch in wanted]
    if args.quick:
        table = [r for r in table if r.batch == min(x.batch for x in table if x.model == r.model)]

    t0 = time.perf_counter()
    topo = Topology(load_cluster_spec(args.cluster))
    specs = {m: load_model_spec(MODELS[m]) for m in models}
    rows = []
    for i, paper in enumerate(table, 1):
        row = run_row(topo, specs[paper.model], paper, args.compute)
        rows.append(row)
        best = row.best
        print(f"[{i}/{len(table)}] {paper.model} batch {paper.batch}: {len(row.outcomes)} configs,"
              f" {sum(o.fits for o in row.outcomes)} fit, best {fmt_config(best.config if best else None)}"
              f" ({row.seconds:.1f} s)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    agree = agreement(rows)
    if args.json:
        used = sorted({r.compute_used for r in rows if r.compute_used}) or [args.compute]
        json.dump({"cluster": args.cluster.name, "compute": args.compute, "compute_used": used,
                   "rows": [r.as_dict() for r in rows], "agreement": agree, "seconds": seconds}, sys.stdout, indent=1)
        print()
    else:
        print_table(rows, agree, args.compute, seconds, args.cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
