"""The plan report and --plot at scale: bytes, seconds and the tallest figure.

Plans GPT-3 175B on ``dgx-a100-128x8`` (1 024 GPUs) and mlp16 on ``dgx-h100-4x8`` and writes
each plan's HTML report and pipeline picture (PNG), printing their sizes, the seconds to
write them (the search is timed apart) and the report's page height in pixels in headless
Chromium at 1 280 px wide when Chromium is installed.  Goal: the 1 024-GPU report at most
2 MB.

    python benchmarks/report_scale.py         # about a minute
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("mlp16", "dgx-h100-4x8"), ("gpt3-175b", "dgx-a100-128x8")]


def page_height(html: Path) -> str:
    """The page's height in Chromium, or '-' without Chromium."""
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        return "-"
    # a screenshot of a very tall window: the last row that is not white is the page's end
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "s.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1280,30000", html.as_uri()], capture_output=True,
                       timeout=180)
        if not shot.exists():
            return "-"
        import matplotlib.image

        pixels = matplotlib.image.imread(shot)[..., :3]
        rows = (pixels < 0.99).any(axis=(1, 2)).nonzero()[0]
        return str(int(rows[-1]) + 1) if len(rows) else "0"


def main() -> None:
    from solver_planner.plan import make_plan
    from solver_planner.plan.compose import breakdown
    from solver_planner.plan.planfile import plan_document
    from solver_planner.report.html import write_plan_report
    from solver_planner.report.pipeline import plot_pipeline
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages.memory import stage_memory
    from solver_planner.topology import Topology

    print(f"{'plan':28} {'GPUs':>5} {'micro-batches':>13} {'report MB':>9} {'report s':>8} {'page px':>8}"
          f" {'plot MB':>8} {'plot s':>7} {'search s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for model, cluster in CASES:
            topo = Topology(load_cluster_spec(ROOT / f"specs/clusters/{cluster}.yaml"))
            spec = load_model_spec(ROOT / f"specs/models/{model}.yaml")
            t0 = time.perf_counter()
            plan = make_plan(topo, spec, schedule="eager-1f1b")
            search = time.perf_counter() - t0
            html = Path(tmp) / f"{model}.html"
            t0 = time.perf_counter()
            write_plan_report(html, plan, plan_document(plan))
            report_s = time.perf_counter() - t0
            png = Path(tmp) / f"{model}.png"
            c = plan.partition.costs
            t0 = time.perf_counter()
            plot_pipeline(png, plan.run, c.shape.size, c.device_memory, model, breakdown(plan),
                          stage_memory(plan.partition, plan.run.peak_memory))
            plot_s = time.perf_counter() - t0
            print(f"{model + ' on ' + cluster:28} {topo.num_devices:5} {c.microbatches:13}"
                  f" {html.stat().st_size / 1e6:9.2f} {report_s:8.1f} {page_height(html):>8}"
                  f" {png.stat().st_size / 1e6:8.2f} {plot_s:7.1f} {search:8.1f}")


if __name__ == "__main__":
    main()
