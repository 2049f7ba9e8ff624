"""One command line (issue 15): the same spelling and short flags everywhere, --version,
JSON errors under --json, plain help, hints for swapped arguments, plausibility warnings,
output paths checked before the work, and answers that do not depend on the hash seed."""

import json
import re

import pytest

from conftest import CLUSTERS, ROOT, SPECS, run_cli
from solver_planner import __version__
from solver_planner.cli import app

P3 = CLUSTERS / "aws-p3.8xlarge-2.yaml"
GPT = SPECS / "models" / "gpt3-2.6b.yaml"


def commands():
    """Every leaf command as its argument path, e.g. ('reduce', 'verify')."""
    import typer.main

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, prefix + (name,))
            else:
                yield prefix + (name,), cmd

    return list(walk(typer.main.get_command(app), ()))


def test_version():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"solver-planner {__version__}"


def test_every_flag_is_shown_as_a_flag_and_help_is_rewrapped():
    from typer.testing import CliRunner

    runner = CliRunner()
    for path, _ in commands():
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
        assert r.exit_code == 0, path
        assert "<bool>" not in r.stdout, path
        if "--json" in r.stdout:
            assert re.search(r"^\s+--json\s{2,}\S", r.stdout, re.M), (path, r.stdout)


def test_short_m_means_method_everywhere_and_methods_have_one_spelling():
    for path, cmd in commands():
        for p in cmd.params:
            if "-m" in getattr(p, "opts", []):
                assert "--method" in p.opts, (path, p.opts)
            if "--matrix" in getattr(p, "opts", []):
                assert "-m" not in p.opts
    r = run_cli("stages", P3, GPT, "--method", "cpsat")
    assert r.returncode == 2 and "did you mean 'cp-sat'" in r.stderr
    r = run_cli("reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml",
                "-m", "cpsat")
    assert r.returncode == 2 and "did you mean 'cp-sat'" in r.stderr


@pytest.mark.parametrize("args, code, where", [
    (["stages", P3, GPT, "--method", "magic"], 2, None),                      # a library option error
    (["stages", P3, GPT, "--top", "0"], 2, None),                             # click's own check
    (["show", SPECS / "models" / "broken.yaml"], 2, None),                    # no such file
    (["schema", "nope"], 2, None),
])
def test_json_errors_go_to_stdout_too(args, code, where):
    r = run_cli(*args, "--json")
    assert r.returncode == code
    err = json.loads(r.stdout)["error"]
    assert err["code"] == code and err["message"] and set(err) == {"code", "file", "line", "key", "message"}
    assert r.stderr.strip() and "Traceback" not in r.stderr


def test_json_spec_error_names_file_line_and_key(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("name: c\nlevels:\n  - {name: host, count: 2}\ndevice: {name: g, flops: 1 TFLOP/s, memory: -1 GiB}\n")
    r = run_cli("show", bad, "--json")
    assert r.returncode == 2
    err = json.loads(r.stdout)["error"]
    assert err["file"] == str(bad) and isinstance(err["line"], int) and err["key"]


def test_swapped_arguments_get_a_hint():
    r = run_cli("stages", GPT, P3)
    assert r.returncode == 2 and "model spec's key, in the file given where the cluster spec goes" in r.stderr
    assert re.search(rf"{re.escape(str(GPT))}:\d+: transformer:", r.stderr)
    r = run_cli("plan", P3, P3)
    assert r.returncode == 2 and "cluster spec's key, in the file given where the model spec goes" in r.stderr
    assert re.search(rf"{re.escape(str(P3))}:\d+: levels:", r.stderr)
    # under --json the error object names them too (they were null, said only in the message)
    r = run_cli("plan", GPT, P3, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["file"] == str(GPT) and isinstance(err["line"], int) and err["key"] == "transformer"


def test_validate_checks_each_model_against_each_cluster():
    r = run_cli("validate", CLUSTERS / "local-2x4.yaml", CLUSTERS / "p2-a100-4x16.yaml",
                SPECS / "models" / "p2-example.yaml", "--json")
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["files"][2]
    assert model["fits"] == ["p2-a100-4x16"] and list(model["does_not_fit"]) == ["local-2x4"]
    r = run_cli("validate", SPECS / "models" / "p2-example.yaml")
    assert r.returncode == 0 and "not checked against a cluster" in r.stdout
    r = run_cli("validate", CLUSTERS / "local-2x4.yaml", SPECS / "models" / "p2-example.yaml")
    assert r.returncode == 2 and "local-2x4" in r.stderr


def test_validate_warns_when_no_plan_can_fit_in_memory_and_the_floor_is_below_what_stages_needs():
    """'fits' used to mean only that the axes multiply to the device count: GPT-3 39B on two
    p3.8xlarge hosts 'fit' while `stages` said it needs 79.61 GiB per device.  The warning's
    floor (weights and optimizer state spread over every device) is a lower bound of the
    least `stages` finds."""
    big = SPECS / "models" / "gpt3-39b.yaml"
    r = run_cli("validate", P3, big, "--json")
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["files"][1]
    floor = entry["too_large"]["aws-p3.8xlarge-2"]["bytes_per_device_at_least"]
    assert any("cannot fit in aws-p3.8xlarge-2's memory" in w for w in entry["warnings"])
    r = run_cli("validate", P3, big)
    assert r.returncode == 0 and "consistent with aws-p3.8xlarge-2" in r.stdout and "fits" not in r.stdout
    assert "warning:" in r.stderr and "63.71 GiB per device" in r.stderr
    s = run_cli("stages", P3, big)
    assert s.returncode == 1
    needs = float(re.search(r"needs ([0-9.]+) GiB per device", s.stderr).group(1))
    assert floor / 2**30 <= needs
    # the README's example quotes both figures as these commands print them
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    assert f"at least {floor / 2**30:.2f} GiB per device, 15 GiB usable" in readme
    assert f"the plan needing least needs {needs:.2f} GiB" in readme
    # a model that has a plan there gets no such warning
    r = run_cli("validate", P3, SPECS / "models" / "gpt3-2.6b.yaml", "--json")
    entry = json.loads(r.stdout)["files"][1]
    assert entry["too_large"] == {} and not entry["warnings"]


def test_unit_slips_are_warned_about(tmp_path):
    text = P3.read_text().replace("bandwidth: 10 Gbps", "bandwidth: 400").replace("latency: 25us", "latency: 5")
    slip = tmp_path / "slip.yaml"
    slip.write_text(text)
    r = run_cli("show", slip)
    assert r.returncode == 0
    assert "bandwidth 400 B/s" in r.stderr and "latency 5 s" in r.stderr and f"{slip}:" in r.stderr
    model = tmp_path / "m.yaml"
    model.write_text("name: m\nparallelism: {axes: [{name: data, size: 8}]}\nreductions: [{name: g, axes: [data], bytes: 8}]\n")
    r = run_cli("validate", P3, model)
    assert r.returncode == 0 and "a reduction of 8 bytes" in r.stderr
    r = run_cli("cost", P3, "--level", "gpu")
    assert r.returncode == 0 and "one device" in r.stderr
    r = run_cli("show", P3)
    assert "warning" not in r.stderr


@pytest.mark.parametrize("args", [
    ["stages", P3, GPT, "--trace"], pytest.param(["plan", P3, GPT, "-o"], marks=pytest.mark.slow),
    ["plan", P3, GPT, "--trace"],
    pytest.param(["reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml",
                  "--trace"], marks=pytest.mark.slow),
    pytest.param(["schema", "cluster", "-o"], marks=pytest.mark.slow),
])
def test_output_paths_are_checked_before_the_work(tmp_path, args):
    r = run_cli(*args, tmp_path / "missing" / "out.json")
    assert r.returncode == 2 and "does not exist" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli(*args, tmp_path)
    assert r.returncode == 2 and "folder" in r.stderr


@pytest.mark.slow
def test_nccl_without_gpus_is_an_environment_error():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.device_count() >= 8:
        pytest.skip("this machine has GPUs")
    r = run_cli("execute", "reshard", CLUSTERS / "local-2x4.yaml", SPECS / "models" / "local-2x4.yaml",
                "--backend", "nccl", "-n", "same-spec")
    assert r.returncode == 2 and "nccl" in r.stderr


def _answer(stdout: str) -> str:
    """The JSON without the keys that are measured times."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("solve_time", "wall_time", "solve_times",
                                                                     "objective_proven_after", "time_s")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return json.dumps(strip(json.loads(stdout)), sort_keys=True)


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml"],
    ["stages", P3, SPECS / "models" / "u-transformer.yaml", "-s", "eager-1f1b", "--no-baselines"],
    ["plan", P3, GPT, "-s", "1f1b"],
])
def test_same_answer_whatever_the_hash_seed(args):
    answers = set()
    for seed in ("0", "4242"):
        r = run_cli(*args, "--json", env={"PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr
        answers.add(_answer(r.stdout))
    assert len(answers) == 1


def test_run_without_torch_says_so_in_one_line(tmp_path):
    """`run` imported torch before saying anything, so a machine without it got a traceback
    (exit 1); it now says what to install and exits 2, as `execute` and `calibrate` do."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"          # import torch -> ImportError
            "from solver_planner.cli import app\n"
            f"app(['run', {str(CLUSTERS / 'aws-p3.8xlarge-2.yaml')!r}, {str(SPECS / 'models' / 'gpt3-2.6b.yaml')!r},"
            f" {str(tmp_path / 'plan.yaml')!r}])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "torch.distributed, which is not installed" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_missing_input_file_is_one_line_and_named_in_the_json(tmp_path):
    """click's own errors printed its usage block (three lines) and the JSON error object had
    no file; now one line, as every other error, and the file under --json."""
    missing = tmp_path / "nope.yaml"
    r = run_cli("stages", missing, SPECS / "models" / "gpt3-2.6b.yaml")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope.yaml' does not exist" in r.stderr
    assert "-h'" in r.stderr and "Usage:" not in r.stderr
    r = run_cli("stages", missing, SPECS / "models" / "gpt3-2.6b.yaml", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["file"] == str(missing)
    r = run_cli("stages", "--no-such-flag")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "No such option" in r.stderr


def test_an_unknown_option_names_the_closest_real_options():
    """click compared option names with their dashes, so '--hel' on `plan` got "Possible
    options: --help, --meshes, --schedule" and '--hlp' on `stages` "--help, --top"; the
    suggestion now compares the names without dashes, leaves --help to the '-h' hint, and
    says so when no option is close."""
    r = run_cli("plan", "--hel", "x.yaml")
    line = r.stderr.strip()
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert line.startswith("error: No such option: --hel (none of this command's options is close) (see '")
    assert line.endswith(" plan -h')")
    r = run_cli("stages", "--hlp", "x.yaml")
    assert "--top" not in r.stderr and "--help" not in r.stderr and "none of this command's options" in r.stderr
    r = run_cli("stages", P3, GPT, "--budgett", "3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "No such option: --budgett (closest: --budget, --sim-budget) (see '" in r.stderr
    r = run_cli("plan", P3, GPT, "--schedul", "1f1b")
    assert "(closest: --schedule)" in r.stderr
    r = run_cli("plan", P3, GPT, "--time", "3")            # the start of a name is close
    assert "(closest: --time-limit)" in r.stderr
    r = run_cli("stages", "--overlp", "--json")           # a command without the option: none close
    assert "none of this command's options is close" in r.stderr
    r = run_cli("plan", "--no-overlp", "x.yaml", "--json")
    assert r.returncode == 2 and "(closest: --no-overlap" in r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["code"] == 2 and err["message"] in r.stderr and "(closest: --no-overlap" in err["message"]


def test_show_says_a_plan_file_is_one_and_which_commands_read_it(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("format: solver-planner-plan\nversion: 4\ncluster: c\nmodel: m\n")
    res = run_cli("show", plan)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "a plan file" in res.stderr and f"check CLUSTER MODEL {plan}" in res.stderr
    assert "unknown key" not in res.stderr


@pytest.mark.parametrize("args, near", [
    (("cost", P3, "-a", "rnig"), "did you mean 'ring'"),
    (("cost", P3, "-c", "allreduc"), "did you mean 'allreduce'"),
    (("reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml", "-s", "sendrecv"),
     "did you mean 'send-recv'"),
    (("reduce", "verify", CLUSTERS / "p2-v100-2x8.yaml", SPECS / "models" / "dp16.yaml", "AllReduce(root, InsideGroup)",
      "--engine", "semantic"), "did you mean 'semantics'"),
])
def test_every_choice_option_suggests_the_near_value(args, near):
    """The README promises "did you mean" for an unknown value; -m had it, these did not."""
    r = run_cli(*args)
    assert r.returncode == 2 and near in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_specs_further_problems_are_each_said(tmp_path):
    """The message counts them ("and 1 more problem"); each is said too: an `also:` line on
    stderr and an entry of `also` in --json's error object."""
    bad = tmp_path / "c.yaml"
    text = (CLUSTERS / "aws-p3.8xlarge-2.yaml").read_text()
    bad.write_text(text.replace("bandwidth: 10 Gbps", "bandwidth: -10 Gbps").replace("latency: 25us", "latency: -25us"))
    r = run_cli("stages", bad, GPT, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and "(and 1 more problem)" in err["message"] and err["key"].endswith("bandwidth")
    assert [a["key"] for a in err["also"]] == ["interconnects[1].latency"] and err["also"][0]["line"] == err["line"] + 1
    assert re.search(r"^  also: .*:\d+: interconnects\[1\]\.latency: ", r.stderr, flags=re.M), r.stderr
