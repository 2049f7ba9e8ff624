"""``benchmarks/scale.py``'s deep families as the README runs them, on a small model: every
row is the real command, and `check` reads the plan file `plan` wrote."""

import subprocess
import sys

from conftest import ROOT


def test_the_deep_families_run_plan_then_check_and_the_eager_search():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--commands", "deep-plan,deep-eager",
                          "--gpus", "8", "--layers", "4", "--repeat", "1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # the table's columns: family (10), GPUs (7), case (52), exit (4), ...
    rows = [(line[:10].strip(), line[20:72].strip(), line[73:77].strip()) for line in out.stdout.splitlines()[1:]]
    assert rows == [("deep-plan", "4 equal layers: plan -o plan.yaml", "0"),
                    ("deep-plan", "4 equal layers: check plan.yaml", "0"),        # check failing its file: 1
                    ("deep-eager", "4 equal layers, eager-1F1B", "0")]
    assert "gap" in out.stdout.splitlines()[-1] and "devices used 8 of 8" in out.stdout


def test_the_stage_benchmark_builds_its_clusters_through_the_spec_loader():
    # benchmarks/stages.py validated its YAML without the loader, so the device preset was
    # never filled in and the script failed on its first row; one row of it, run
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import stages as bench

    topo = bench.dgx(2)
    assert topo.num_devices == 16 and topo.device.name == "A100-SXM4-80GB"
    assert bench.row(bench.gpt(10), 1).split()[:3] == ["gpt-12", "8", "OPTIMAL"]
