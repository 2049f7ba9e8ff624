"""--target megatron: the search lists only what Megatron-LM runs, and says why it refuses."""

import json
import math

import pytest

from typer.testing import CliRunner

from solver_planner.cli import app
from solver_planner.targets.megatron import allows, export, parse

from conftest import CLUSTERS, SPECS, llama_training

MODELS = SPECS / "models"


def test_every_plan_a_target_search_lists_is_one_the_framework_runs():
    """Each listed plan's TargetConfig passes the framework's own rules (megatron.allows)."""
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages.report import plan_stages
    from solver_planner.targets.search import target_config
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(CLUSTERS / "dgx-a100-8x8.yaml"))
    spec = load_model_spec(SPECS.parent / "examples" / "hf" / "llama-3-8b-training.yaml")
    rep = plan_stages(topo, spec, None, top=5, target="megatron")
    assert rep.result.status.value == "OPTIMAL" and len(rep.result.solutions) == 5
    for cand in rep.result.solutions:
        cfg = target_config(cand.plan, cand.schedule, spec, "megatron")
        assert allows(cfg) is None, (cfg, allows(cfg))
        assert cfg.kv_heads == 8 and cfg.activation == "swiglu" and cfg.devices == 64
        # the framework runs the plan's micro-batches: as many per iteration, each replica's share
        c = cand.plan.costs
        assert cfg.microbatches == c.microbatches and cfg.micro_batch_size * cfg.data == c.micro_size
        flags = parse(export(cfg))
        assert flags["--global-batch-size"] // (flags["--micro-batch-size"] * cfg.data) == c.microbatches


def test_stages_target_megatron_lists_only_runnable_plans():
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"), str(MODELS / "gpt3-39b.yaml"),
                                   "--target", "megatron", "--top", "3", "--json", "--no-baselines"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["status"] == "OPTIMAL" and data["search"]["space"] == "megatron"
    for row in [data] + data.get("top", []):
        tensors = {s["tensor"] for s in row["stages"]}
        assert len(tensors) == 1
        assert row["schedule"].split("(")[0] in ("1f1b", "interleaved-1f1b")


def test_a_schedule_the_target_does_not_run_is_refused():
    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-a100-8x8.yaml"), str(MODELS / "gpt3-39b.yaml"),
                                   "--target", "megatron", "--schedule", "zb-v"])
    assert res.exit_code == 2 and "megatron does not run zb-v" in res.output


def test_the_readmes_megatron_answer_is_what_the_command_prints(tmp_path):
    """The README's GPT-3 175B / 1 024 A100s answer, rerun: the same five configurations."""
    import re
    import shlex

    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("$ solver-planner stages") and "--target megatron" in x)
    argv = shlex.split(line[2:])[1:]
    res = CliRunner().invoke(app, argv + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    block = text[text.index(line):].split("```")[0]
    rows = re.findall(r"^ (\d) +(\d+,\d+,\d+,\d+) ", block, flags=re.M)
    listed = [",".join(str(c["config"][k]) for k in ("data", "tensor", "pipeline", "microbatches"))
              for c in data["top"]]
    assert [r[1] for r in rows] == listed[:5]
    times = re.findall(r"^ \d +\S+ +\S+ +\S+ +[\d.]+ \w+ +([\d.]+) s +([\d.]+) s +\S+ +([\d.]+)%", block, flags=re.M)
    assert times == [(f"{c['iteration_time']:.3g}", f"{c['objective']:.3g}", f"{100 * c['pair_gap']:.2f}")
                     for c in data["top"][:5]]
    # the paragraph after it: the native searches of interleaved 1F1B and of 1F1B
    after = text[text.index(line):].split("```")[1]
    base = [a for a in argv if a not in ("--target", "megatron", "--top", "5")]
    flat = " ".join(after.split())
    res = CliRunner().invoke(app, base + ["-s", "interleaved-1f1b", "--json", "--no-baselines"])
    native_il = json.loads(res.output)
    got = ",".join(str(native_il["config"][k]) for k in ("data", "tensor", "pipeline", "microbatches"))
    chunks = re.search(r"v=(\d+)", native_il["schedule"]).group(1)
    assert got == "64,4,4,24" and f"finds {got} with {chunks} chunks per stage at {native_il['iteration_time']:.3g} s" in flat
    # the distributed optimizer with overlap: a reduce-scatter per bucket, the gathers ahead
    assert native_il["stages"][0]["gradient_program"] == "ReduceScatter"
    # the native 1F1B plan: per-stage configurations, as the paragraph lists them
    one = json.loads(CliRunner().invoke(app, base + ["-s", "1f1b", "--json", "--no-baselines"]).output)
    cfg = one["config"]
    slower = one["iteration_time"] / native_il["iteration_time"] - 1
    if isinstance(cfg["data"], list):           # per-stage configurations
        (d0, *ds), (t0, *ts) = cfg["data"], cfg["tensor"]
        assert len(set(ds)) == len(set(ts)) == 1
        what = (f"{cfg['pipeline']} stages of {cfg['microbatches']} micro-batches, the first at d = {d0}, t = {t0}"
                f" and the others at d = {ds[0]}, t = {ts[0]}")
    else:
        what = ",".join(str(cfg[k]) for k in ("data", "tensor", "pipeline", "microbatches"))
    assert (f"finds {what} at {one['iteration_time']:.3g} s ({100 * slower:.0f}% slower than the native"
            " interleaved plan)") in flat
    p, k = cfg["pipeline"], cfg["microbatches"]
    assert f"1F1B idles {p - 1} of {k + p - 1} micro-batch slots on {p} stages with {k} micro-batches" in flat
    assert "32,4,8,48" == listed[0] and "64,4,4,24" not in listed
    # the native plan's advantage, as the paragraph says it
    native = json.loads(CliRunner().invoke(app, base + ["-s", "interleaved-1f1b", "--json", "--no-baselines"]).output)
    faster = 1 - native["iteration_time"] / data["iteration_time"]
    assert f"The native plan is {100 * faster:.1f}% faster" in " ".join(after.split())
    # Megatron-LM cannot run it: its fp32 gradient buffer does not fit
    res = CliRunner().invoke(app, base + ["--target", "megatron", "--config", "64,4,4,24", "-s", "interleaved-1f1b",
                                          "--no-baselines"])
    assert res.exit_code == 1, res.output
    need = re.search(r"needs ([\d.]+) GiB per device", res.output).group(1)
    assert f"would need {need} GiB per device" in " ".join(after.split())
    # with bf16 reduction: its best, and its first stage's reduction beside P²'s
    bf16 = tmp_path / "bf16.yaml"
    bf16.write_text((ROOT / argv[2]).read_text().replace("  dtype: bfloat16\n",
                                                         "  dtype: bfloat16\n  gradient_reduce_dtype: bfloat16\n"))
    res = CliRunner().invoke(app, ["stages", str(ROOT / argv[1]), str(bf16), "--target", "megatron", "--json",
                                   "--no-baselines"])
    best = json.loads(res.output)
    got = ",".join(str(best["config"][k]) for k in ("data", "tensor", "pipeline", "microbatches"))
    assert f"its best is {got} again, at {best['iteration_time']:.3g} s" in after
    first = best["stages"][0]
    assert first["gradient_program"] == "ReduceScatter"                # "both reduce the same way"
    # ... in Megatron-Core's buckets (max(40M, 1M x d) parameters of bf16) against DDP's 25 MiB
    d = best["config"]["data"]
    assert f"{max(40, d) * 2:.0f} MB of bf16 here, with d = {d}" in flat
    longer = best["iteration_time"] / native_il["iteration_time"] - 1
    assert f"the simulated iteration {100 * abs(longer):.1f}% {'longer' if longer > 0 else 'shorter'} than the" \
           " native plan's" in flat


@pytest.mark.slow
def test_plan_target_without_a_schedule_takes_the_target_searchs_fastest_schedule(tmp_path):
    """GPT-3 2.6B on two p3.8xlarge hosts: Megatron-LM's fastest plan is interleaved 1F1B, so
    `plan --target megatron` without -s composes interleaved 1F1B (not 1F1B), and check
    accepts the plan file it writes.  (On four hosts it was too, until Megatron-LM's fp32 main
    gradients of fp16 models were counted: its fastest plan there is now 1F1B.)"""
    cluster, model = str(CLUSTERS / "aws-p3.8xlarge-2.yaml"), str(MODELS / "gpt3-2.6b.yaml")
    res = CliRunner().invoke(app, ["stages", cluster, model, "--target", "megatron", "--json", "--no-baselines"])
    best = json.loads(res.output)["schedule"].split("(")[0]
    assert best == "interleaved-1f1b"
    plan = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["plan", cluster, model, "--target", "megatron", "-o", str(plan)])
    assert res.exit_code == 0, res.output
    import yaml
    assert yaml.safe_load(plan.read_text())["schedule"]["family"] == best
    assert CliRunner().invoke(app, ["check", cluster, model, str(plan)]).exit_code == 0
    # native plans keep their default (eager-1F1B), held by the library for the command and the API
    from solver_planner.plan.compose import make_plan
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.topology import Topology
    assert make_plan(Topology(load_cluster_spec(cluster)), load_model_spec(model), None).family == "eager-1f1b"


def test_plan_target_export_is_written_recorded_and_checked(tmp_path):
    """plan --target megatron --export: the file is the plan's recorded export; check derives
    it again, so an edited export, config or framework name is refused."""
    import yaml

    cluster, model = str(CLUSTERS / "local-2x4.yaml"), str(MODELS / "gpt-tiny.yaml")
    plan, out = tmp_path / "p.yaml", tmp_path / "megatron.sh"
    res = CliRunner().invoke(app, ["plan", cluster, model, "--target", "megatron", "-o", str(plan),
                                   "--export", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(plan.read_text())
    assert out.read_text() == doc["target"]["export"] and "--pipeline-model-parallel-size" in out.read_text()
    assert doc["search"]["options"]["target"] == "megatron"
    assert CliRunner().invoke(app, ["check", cluster, model, str(plan)]).exit_code == 0
    for path, value in [(("target", "export"), doc["target"]["export"].replace("--micro-batch-size", "--mbs")),
                        (("target", "config", "tensor"), 3), (("target", "framework"), "torchtitan"),
                        (("search", "options", "target"), "native")]:
        bad = yaml.safe_load(plan.read_text())
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        edited = tmp_path / "bad.yaml"
        edited.write_text(yaml.safe_dump(bad, sort_keys=False))
        res = CliRunner().invoke(app, ["check", cluster, model, str(edited)])
        assert res.exit_code == 1, (path, res.output)
        if path == ("target", "export"):
            # the message shows the line that differs, not the export's first 80 characters
            line = next(i for i, x in enumerate(doc["target"]["export"].split("\n"), 1) if "--micro-batch-size" in x)
            assert f"line {line}: recorded" in res.output and "--mbs" in res.output, res.output


def test_export_needs_a_target(tmp_path):
    res = CliRunner().invoke(app, ["plan", str(CLUSTERS / "local-2x4.yaml"), str(MODELS / "gpt-tiny.yaml"),
                                   "--export", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--target" in res.output


def test_the_readmes_plan_export_command_runs(tmp_path, monkeypatch):
    import shlex

    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("$ solver-planner plan") and "--export" in x)
    argv = [str(ROOT / a) if a.startswith("specs/") else a for a in shlex.split(line[2:])[1:]]
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert "MEGATRON_ARGS=(" in (tmp_path / "megatron.sh").read_text()
    # the README's next line sources it: bash must read it into the argument array
    import subprocess

    out = subprocess.run(["bash", "-c", 'source megatron.sh; printf "%s\\n" "${MEGATRON_ARGS[@]}"'],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split("\n")
    assert "--tensor-model-parallel-size" in out and "--pipeline-model-parallel-size" in out


def test_a_target_search_is_the_best_of_every_plan_the_framework_runs():
    """OPTIMAL over Megatron's space, refuted by brute force: every uniform plan (equal and
    first/last-lighter splits) that megatron.allows and memory admit, simulated."""
    import math

    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages import StageSearch
    from solver_planner.stages.fastsim import pipeline_run
    from solver_planner.stages.layers import layer_model
    from solver_planner.stages.objective import fits
    from solver_planner.stages.report import plan_stages
    from solver_planner.stages.uniform import uniform_plans
    from solver_planner.targets.search import restriction
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(CLUSTERS / "local-2x4.yaml"))
    spec = load_model_spec(MODELS / "gpt-tiny.yaml")
    rep = plan_stages(topo, spec, None, target="megatron")
    assert rep.result.status.value == "OPTIMAL"
    r = restriction("megatron", spec, None)
    # the layer model as the target prices it (Megatron-Core's buckets: first stage only)
    search = StageSearch(layer_model(spec, "megatron"), topo, **r)
    best, seen = math.inf, 0
    for pair in search.pairs():
        for plan, s in uniform_plans(pair, r["uniform"], r["splits"], r["allows"]):
            seen += 1
            if fits(plan, s):
                best = min(best, pipeline_run(plan, s)[0].iteration_time)
    assert seen > 10
    assert rep.best.time == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("target,schedule", [("megatron", "interleaved-1f1b"), ("torchtitan", "zb-v"),
                                             ("torchtitan", "interleaved-1f1b")])
def test_a_chunked_target_plan_is_exported_and_checked(tmp_path, target, schedule):
    """plan --target X -s <chunked> --export on Llama-3-8B: the plan carries model chunks, the
    export names the framework's virtual stages and the plan's micro-batches, check passes."""
    import yaml

    from solver_planner.targets.search import target_module

    # torchtitan shards with FSDP2, and its selective checkpointing is per operator
    model = (llama_training(tmp_path, optimizer_sharding="zero-3", recompute="selective-op")
             if target == "torchtitan" else llama_training(tmp_path))
    cluster = str(CLUSTERS / "dgx-a100-8x8.yaml")
    plan, out = tmp_path / "p.yaml", tmp_path / "export.txt"
    res = CliRunner().invoke(app, ["plan", cluster, str(model), "--target", target, "-s", schedule, "-o", str(plan),
                                   "--export", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(plan.read_text())
    v = doc["schedule"]["virtual"]
    assert v >= 2 and len(doc["stages"]) == v * len(doc["launch"]["stages"])
    cfg = doc["target"]["config"]
    assert cfg["virtual_stages"] == v and cfg["schedule"] == schedule
    assert cfg["micro_batch_size"] * cfg["data"] * doc["microbatches"] == doc["global_batch"]
    flags = target_module(target).parse(out.read_text())
    if target == "megatron":
        assert flags["--micro-batch-size"] == cfg["micro_batch_size"]
        if "--pipeline-model-parallel-layout" not in flags:      # a layout implies the chunk count
            assert flags["--num-virtual-stages-per-pipeline-rank"] == v
        pytest.importorskip("megatron.core")
        from test_targets_export import _megatron_objects

        assert _megatron_objects(flags)[0].virtual_pipeline_model_parallel_size == v
    else:
        assert flags["--parallelism.pipeline_parallel_schedule"] == \
            {"zb-v": "ZBVZeroBubble", "interleaved-1f1b": "Interleaved1F1B"}[schedule]
        assert flags["--parallelism.pipeline_parallel_microbatch_size"] == cfg["micro_batch_size"]
        assert flags["activation-checkpoint"] == "selective" and cfg["recompute"] == "selective-op"
    assert CliRunner().invoke(app, ["check", cluster, str(model), str(plan)]).exit_code == 0


def test_a_space_the_target_runs_none_of_names_every_reason(tmp_path):
    """The shipped Llama-3-8B job under torchtitan: every plan breaks a rule, several rules in
    all; the message named the most common and counted the rest ('and 2 other reason(s)'):
    each is named now, with the plans it refused, most common first."""
    import json
    import re

    from conftest import ROOT

    res = CliRunner().invoke(app, ["stages", str(CLUSTERS / "dgx-h100-4x8.yaml"),
                                   str(ROOT / "examples" / "hf" / "llama-3-8b-training.yaml"), "--target",
                                   "torchtitan", "--json"])
    assert res.exit_code == 1, res.output
    message = json.loads(res.stdout)["error"]["message"]
    total = int(re.search(r"runs none of the (\d+) uniform plans; the first rule each breaks: ", message).group(1))
    counts = [int(n) for n in re.findall(r"\((\d+) plans\)", message)]
    assert len(counts) >= 2 and sum(counts) == total and counts == sorted(counts, reverse=True)
    assert "torchtitan has no selective recompute" in message and "other reason" not in message


def test_the_readmes_torchtitan_launch_is_what_plan_writes(tmp_path):
    """The README's torchtitan example, run: the shipped torchtitan copy of the Llama job
    plans under --target torchtitan, the export holds one argument per line for
    `torchrun ... -m torchtitan.train $(cat torchtitan.args)` (torchtitan's own parser reads
    it where torchtitan is installed), its degrees cover the cluster, and check accepts it."""
    import shlex

    from conftest import ROOT
    from solver_planner.targets import torchtitan as tt

    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("$ solver-planner plan") and "--target torchtitan" in x)
    assert "$ torchrun --nnodes 4 --nproc-per-node 8 ... -m torchtitan.train $(cat torchtitan.args)" in text
    argv = shlex.split(line[2:])[1:]
    plan, args = tmp_path / "plan.yaml", tmp_path / "torchtitan.args"
    argv = [str(plan) if a == "plan.yaml" else str(args) if a == "torchtitan.args" else
            str(ROOT / a) if a.startswith(("specs/", "examples/")) else a for a in argv]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    flags = tt.parse(args.read_text())
    degrees = [int(flags[f"--parallelism.{k}_degree"]) for k in ("data_parallel_shard", "data_parallel_replicate",
                                                                  "tensor_parallel", "pipeline_parallel")]
    assert math.prod(degrees) == 32
    assert flags["activation-checkpoint"] == "selective"
    assert CliRunner().invoke(app, ["check", argv[1], argv[2], str(plan)]).exit_code == 0
    try:
        from torchtitan.config import ConfigManager
    except Exception:                         # torchtitan is not installed (CI installs it)
        return
    ConfigManager().parse_args(tt.argv(args.read_text()))


@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_sequence_parallelism_at_tensor_one_is_nothing_to_refuse(tmp_path, target):
    """A spec with sequence_parallel (and tensor_overlap) planned at tensor 1: both split
    what a tensor-parallel group replicates, so there they do nothing; Megatron-LM's
    arguments.py turns the flag off at tensor 1, and DeepSpeed runs such a plan as any other.
    Every tensor-1 plan was refused ("sequence parallelism needs tensor > 1", "deepspeed has
    no sequence parallelism"). The export leaves the flags out, and check agrees."""
    import yaml

    model = tmp_path / "sp.yaml"
    model.write_text("name: gpt-tiny-sp\ntransformer: {layers: 6, hidden: 64, heads: 4, sequence: 16, vocab: 256}\n"
                     "training: {global_batch: 16, dtype: float32, sequence_parallel: true, tensor_overlap: "
                     f"{'true' if target == 'megatron' else 'false'}}}\n")
    cluster, out = str(CLUSTERS / "local-2x4.yaml"), tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["plan", cluster, str(model), "--target", target, "--config", "4,1,2,4",
                                   "-s", "1f1b", "-o", str(out)])
    assert res.exit_code == 0, res.output
    exported = yaml.safe_load(out.read_text())["target"]["export"]
    if target == "megatron":
        assert "--sequence-parallel" not in exported and "--tp-comm-overlap" not in exported
        assert parse(exported)["--tensor-model-parallel-size"] == 1
    assert CliRunner().invoke(app, ["check", cluster, str(model), str(out)]).exit_code == 0
    # at tensor 2 the same spec still runs them (Megatron-LM) or is refused (DeepSpeed)
    res = CliRunner().invoke(app, ["stages", cluster, str(model), "--target", target, "--config", "2,2,2,4",
                                   "--json"])
    if target == "megatron":
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 1 and "deepspeed has no sequence parallelism" in res.output


def test_a_wrong_export_is_named_beside_a_failing_boundary(tmp_path):
    """The target's configuration and export are derived from the stages alone: a boundary
    edited too (whose failure skips the iteration and the final comparison) no longer hides
    an edited target field."""
    import yaml

    from solver_planner.plan.planfile import write_document

    cluster, model, out = str(CLUSTERS / "local-2x4.yaml"), str(SPECS / "models" / "gpt-tiny.yaml"), tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["plan", cluster, model, "--target", "megatron", "--config", "2,2,2,4", "-s",
                                   "1f1b", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["boundaries"] and doc["target"]["config"]["gradient_bucket"] == 0
    doc["target"]["config"]["gradient_bucket"] = 1
    task = doc["boundaries"][0]["schedule"][0]
    task["start"], task["end"] = task["start"] + 1000, task["end"] + 1000
    write_document(doc, out)
    res = CliRunner().invoke(app, ["check", cluster, model, str(out), "--json"])
    failed = {f["path"] for f in json.loads(res.stdout)["findings"] if f["status"] == "fail"}
    assert res.exit_code == 1 and "target.config.gradient_bucket" in failed
    assert any(p.startswith("boundaries[") for p in failed)


def test_a_method_under_a_target_is_refused_not_recorded_and_ignored():
    """`plan --target megatron -m cp-sat` recorded method cp-sat while the target's exact
    enumeration ran, and check then took any method for it."""
    cluster, model = str(CLUSTERS / "local-2x4.yaml"), str(SPECS / "models" / "gpt-tiny.yaml")
    for command in ("plan", "stages"):
        res = CliRunner().invoke(app, [command, cluster, model, "--target", "megatron", "-m", "cp-sat"])
        assert res.exit_code == 2 and "--method cp-sat does not apply" in res.output, res.output
    assert CliRunner().invoke(app, ["stages", cluster, model, "--target", "megatron", "-m", "auto",
                                    "--no-baselines"]).exit_code == 0


def test_stages_the_framework_would_not_run_fail_the_target_part(tmp_path, monkeypatch):
    """The target part exports what the recorded stages make; where the framework's rules
    refuse them the export raised, which ended the whole check as an unreadable value."""
    from solver_planner import api
    from solver_planner.plan.check import check_plan
    from solver_planner.plan.planfile import read_plan
    from solver_planner.targets import megatron

    cluster, model, out = CLUSTERS / "local-2x4.yaml", SPECS / "models" / "gpt-tiny.yaml", tmp_path / "p.yaml"
    api.plan(cluster, model, target="megatron", config="2,2,2,4", schedule="1f1b", output=out)
    monkeypatch.setattr(megatron, "allows", lambda cfg: "a rule of the framework's")
    rep = check_plan(*api.load(cluster, model), read_plan(out))
    failed = [f for f in rep.failures if f.part == "target"]
    assert failed and failed[0].path == "target.config" and "a rule of the framework's" in failed[0].message
    assert not any("cannot read" in f.message for f in rep.failures)
