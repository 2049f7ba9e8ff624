import subprocess
import sys
from pathlib import Path

import pytest

from solver_planner.cost import CostModel
from solver_planner.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
CLUSTERS = SPECS / "clusters"


@pytest.fixture(scope="session")
def a100():
    return load_topology(CLUSTERS / "p2-a100-2x16.yaml")


@pytest.fixture(scope="session")
def a100x4():
    return load_topology(CLUSTERS / "p2-a100-4x16.yaml")


@pytest.fixture(scope="session")
def v100():
    return load_topology(CLUSTERS / "p2-v100-2x8.yaml")


@pytest.fixture(scope="session")
def p3x3():
    return load_topology(CLUSTERS / "aws-p3.8xlarge-3.yaml")


@pytest.fixture
def cost_of():
    return CostModel


def run_cli(*args, cwd=ROOT, env=None):
    """Run the real command in a subprocess, as a user would (``env``: extra variables)."""
    import os
    return subprocess.run([sys.executable, "-m", "solver_planner", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})


def fidelity_row(label: str) -> tuple[str, ...]:
    """The README's fidelity-table row whose first cell starts with ``label`` (a regular
    expression): (pairs, median error %, worst %, Spearman, pairwise %, measured / predicted)."""
    import re

    row = re.search(rf"^  \| {label}[^|]*\| (\d+) \| ([\d.]+)% \| ([\d.]+)% \| ([\d.]+) \| (\d+)% \| ([\d.]+) \|",
                    (ROOT / "README.md").read_text(), re.M)
    assert row is not None, label
    return row.groups()


def printed_summary(out: str) -> tuple[str, ...]:
    """A benchmark's closing line (``fidelity.summary_line``) as the README's fidelity row
    orders it (:func:`fidelity_row`, less the pairwise share): (pairs, median %, worst %,
    Spearman, measured / predicted)."""
    import re

    found = re.search(r"median \|error\| ([\d.]+)%, worst ([\d.]+)%, Spearman ([\d.]+), measured / predicted"
                      r" ([\d.]+) \((\d+) runs\)", out)
    assert found is not None, out
    median, worst, rho, ratio, pairs = found.groups()
    return pairs, median, worst, rho, ratio


def fidelity_figures(summary: dict) -> tuple[str, ...]:
    """A ``benchmarks/fidelity.py`` summary as the README's row prints it (:func:`fidelity_row`)."""
    return (str(summary["pairs"]), f"{summary['median_error'] * 100:.1f}", f"{summary['worst_error'] * 100:.1f}",
            f"{summary['spearman']:.3f}", f"{summary['pairwise'] * 100:.0f}",
            f"{summary['median_measured_over_predicted']:.2f}")


def one_device_cluster(folder: Path) -> Path:
    """A cluster of a single A100 (the smallest a spec allows), written into ``folder``."""
    path = folder / "one.yaml"
    path.write_text("name: one\nlevels:\n  - {name: gpu, count: 1}\ndevice: {preset: A100-SXM4-80GB}\n"
                    "interconnects:\n  - {name: nv, level: gpu, bandwidth: 300 GB/s, latency: 2us}\n")
    return path


def llama_training(folder: Path, **training: str) -> Path:
    """The shipped Llama-3-8B job (examples/hf/llama-3-8b-training.yaml) copied into
    ``folder`` with its training settings replaced (``recompute="full"`` and so on): its
    config.json is named by its absolute path, so the copy loads from anywhere."""
    import re

    hf = ROOT / "examples" / "hf"
    text = (hf / "llama-3-8b-training.yaml").read_text().replace(
        "hf_config: llama-3-8b.json", f"hf_config: {hf / 'llama-3-8b.json'}")
    for key, value in training.items():
        text, n = re.subn(rf"\b{key}: [\w-]+", f"{key}: {value}", text)
        assert n == 1, key
    path = folder / "llama.yaml"
    path.write_text(text)
    return path


# Property tests draw the same examples on every CI run (DESIGN.md: determinism).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None)
if __import__("os").environ.get("CI"):
    settings.load_profile("ci")


# The quick subset (-m "not slow") leaves out, besides the tests marked slow in place, the
# ones measured slow (tests/measured_slow.txt, one node id a line).
_MEASURED_SLOW = {line.strip() for line in (ROOT / "tests" / "measured_slow.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.nodeid in _MEASURED_SLOW:
            item.add_marker(pytest.mark.slow)
