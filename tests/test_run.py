"""``run``: a plan trained on 8 gloo processes equals one process (issue: run a plan).

Every configuration trains 2 steps with the same seed and data as a single-process run of the
same model (the second step starts from the first one's parameters and optimizer state, so
both the update and what the optimizer keeps are compared). Bounds: each step's loss within
1e-6 (relative); every parameter after the last step within 1e-5 (relative) with SGD, and
within 1e-4 with Adam -- Adam divides each element's update by the gradient's own running
size, so an element whose gradient is near zero turns the rounding of a different fp32
summation order (data-parallel and tensor-parallel partial sums, micro-batches) into a step of
up to the learning rate; one process summing its micro-batches in reverse order already
differs by up to 6e-6.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "specs/clusters/local-2x4.yaml"
TINY = {"layers": 6, "hidden": 64, "heads": 4, "sequence": 16, "vocab": 256}

pytestmark = pytest.mark.slow


def model_file(folder: Path, name: str, transformer=None, layers=None, **training) -> Path:
    doc = {"name": name, "training": {"global_batch": 16, "microbatches": "auto", "dtype": "float32",
                                      "optimizer": "sgd", **training}}
    if transformer is not None:
        doc["transformer"] = transformer
    if layers is not None:
        doc["layers"] = layers
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def plan_file(folder: Path, model: Path, *options: str) -> Path:
    out = folder / f"{model.stem}.plan.yaml"
    subprocess.run([sys.executable, "-m", "solver_planner", "plan", str(CLUSTER), str(model), "-o", str(out),
                    *options], check=True, capture_output=True, cwd=ROOT)
    return out


def job_of(model: Path, plan: Path, steps: int = 2):
    from solver_planner.plan.check import check_plan
    from solver_planner.plan.planfile import read_plan
    from solver_planner.run.job import run_job
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.topology import Topology

    topo = Topology(load_cluster_spec(CLUSTER))
    spec = load_model_spec(model)
    report = check_plan(topo, spec, read_plan(plan))
    assert report.exit_code == 0, report.first_failure
    return run_job(report.plan, spec, steps=steps)


# a heavy first layer and cheap ones with large gradients: the unequal search gives the first
# stage more devices than the others (pure data parallelism pays for the gradients)
UNEQUAL = [{"name": "big", "params": "1 MiB", "activations": "1 KiB", "flops": "2 MFLOP"},
           {"name": "l", "repeat": 5, "params": "1 MiB", "activations": "1 KiB", "flops": "0.1 MFLOP"}]

# name -> (model spec arguments, plan options, what the plan must hold)
CASES = {
    "uniform, eager-1F1B, weight delay, tied, adam": (
        dict(transformer=TINY, optimizer="adam"), ("--config", "2,2,2,4"),
        lambda j: j.schedule == "actions" and "weight delay" in j.schedule_name and
        all(s.data == 2 and s.tensor == 2 for s in j.stages) and len(j.stages) == 2 and j.shape.tied),
    "per-stage (d, t), uneven split": (
        dict(transformer={**TINY, "hidden": 128, "vocab": 4096}), ("--stages", "2"),
        lambda j: len({(s.data, s.tensor) for s in j.stages}) == 2 and
        len({s.last - s.first for s in j.stages}) == 2),
    "gpipe": (
        dict(transformer=TINY), ("--schedule", "gpipe", "--config", "4,1,2,4"),
        lambda j: j.schedule == "gpipe"),
    "1f1b, recomputation, sequence parallelism": (
        dict(transformer=TINY, recompute="full", sequence_parallel=True), ("--schedule", "1f1b", "--config", "1,4,2,4"),
        lambda j: j.schedule == "1f1b" and j.sequence_parallel and all(s.recompute == "full" for s in j.stages)),
    "selective-op recomputation (torch's selective checkpointing) with tensor parallelism": (
        dict(transformer=TINY, recompute="selective-op"), ("--schedule", "1f1b", "--config", "2,2,2,4"),
        lambda j: all(s.recompute == "selective-op" for s in j.stages)),
    "optimizer sharding (FSDP2) with tensor parallelism": (
        dict(transformer=TINY, optimizer_sharding="zero-3"), ("--schedule", "1f1b", "--config", "2,2,2,4"),
        lambda j: j.sharded),
    "ZeRO-2 (every micro-batch's gradients reduce-scattered into the shards) with GPipe": (
        dict(transformer=TINY, optimizer_sharding="zero-2"), ("--schedule", "gpipe", "--config", "2,2,2,4"),
        lambda j: j.sharding == "zero-2" and j.microbatches == 4),
    "optimizer sharding with eager-1F1B (whole backwards)": (
        dict(transformer=TINY, optimizer_sharding="zero-1"), ("--config", "2,2,2,4"),
        lambda j: j.sharded and j.schedule == "actions" and "weight delay" in j.schedule_name and
        all(op != "I" for order in j.orders.values() for op, _ in order)),
    "ZB-H1 (split backwards, weight parts deferred to the cool-down)": (
        dict(transformer=TINY), ("--schedule", "zb-h1", "--config", "2,1,4,4"),
        lambda j: j.schedule == "actions" and j.schedule_name == "zb-h1" and
        any(op == "W" for order in j.orders.values() for op, _ in order)),
    "untied, four stages": (
        dict(transformer=TINY, tied_embeddings=False), ("--config", "2,1,4,4"),
        lambda j: not j.shape.tied and len(j.stages) == 4),
    "unequal meshes (Alpa's space): 4, 2 and 2 devices": (
        dict(layers=UNEQUAL), ("--schedule", "1f1b", "--meshes", "unequal"),
        lambda j: [len(s.ranks) for s in j.stages] == [4, 2, 2] and j.world == 8),
    "the gradient program after the last backward (gradient_overlap: false)": (
        dict(transformer=TINY, gradient_overlap=False), ("--schedule", "1f1b", "--config", "2,2,2,4"),
        lambda j: not j.overlap and all(s.program is not None for s in j.stages)),
    "gradient buckets of 16 KiB (several a layer), GPipe": (
        dict(transformer=TINY, gradient_bucket="16 KiB"), ("--schedule", "gpipe", "--config", "4,1,2,4"),
        lambda j: j.overlap and j.bucket_elements == 4096),
    "one stage holding the token table and its tied logits, pure data parallelism": (
        dict(transformer=TINY), ("--schedule", "1f1b", "--config", "8,1,1,2"),
        lambda j: len(j.stages) == 1 and j.shape.tied and j.overlap and j.stages[0].program is not None),
    "a layers: spec (no architecture)": (
        dict(layers=[{"name": "l", "repeat": 6, "params": "64 KiB", "activations": "1 KiB", "flops": "1 MFLOP"}]),
        ("--config", "2,2,2,4"),
        lambda j: j.shape.kind == "mlp"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from solver_planner.run.launch import run_plans

    folder = tmp_path_factory.mktemp("run")
    jobs = []
    for n, (name, (model_args, options, holds)) in enumerate(CASES.items()):
        model = model_file(folder, f"m{n}", **model_args)
        job = job_of(model, plan_file(folder, model, *options))
        assert holds(job), f"{name}: the plan does not have what this case tests"
        jobs.append(job)
    return dict(zip(CASES, run_plans(jobs)))


@pytest.mark.parametrize("name", list(CASES))
def test_equals_one_process(results, name):
    res = results[name]
    assert len(res.losses) == len(res.reference_losses) == 2
    for got, want in zip(res.losses, res.reference_losses):
        assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    bound = 1e-4 if res.job.optimizer == "adam" else 1e-5
    assert res.max_parameter_difference <= bound, (res.max_parameter_difference, res.worst_parameter)
    # the model trained: the loss moved (a run that skipped the optimizer would also "match" step 1)
    assert res.reference_losses[0] != res.reference_losses[-1]



def test_the_gradient_program_runs_per_bucket_while_the_last_backward_runs(results):
    """``gradient_overlap`` (the default), as the plan prices it: every layer's gradients are
    reduced in buckets of at most ``gradient_bucket`` bytes, each started as soon as the
    stage's last whole backward has produced them (with weight delaying, torch's split
    backward sets the weight gradients itself, so its buckets may start only after the last
    weight-gradient pass); without overlap, once after the backward; FSDP2's reduce-scatter
    for sharded plans.  ``test_equals_one_process`` checks the sums."""
    seen = set()
    for name, res in results.items():
        job = res.job
        for s in job.stages:
            got = res.buckets(s.ranks[0])
            if not job.overlap or s.program is None or (job.sharded and s.data > 1):
                assert got is None, name
                continue
            layers = s.last - s.first + 1
            if job.bucket_elements >= 2**20:      # 25 MiB buckets: one a layer of these tiny models
                assert got["reduced"] == layers, name
            else:
                assert got["reduced"] > 2 * layers, name
                seen.add("small buckets")
            split = job.orders is not None and any(op == "W" for op, _ in job.orders[s.index])
            if split:
                assert 0 <= got["started_during_backward"] <= got["reduced"], name
            else:
                assert got["started_during_backward"] == got["reduced"], name
                seen.add("during")
        if not job.overlap:
            seen.add("after")
            assert not any("per bucket" in n for n in job.notes)
    assert seen == {"small buckets", "during", "after"}


def test_a_plan_on_part_of_the_cluster_runs_on_its_first_devices(tmp_path):
    """4 of the 8 devices idle (the configuration uses 4): 4 processes, the same training."""
    from solver_planner.run.launch import run_plans

    model = model_file(tmp_path, "part", transformer=TINY)
    job = job_of(model, plan_file(tmp_path, model, "--schedule", "1f1b", "--config", "1,2,2,4"), steps=2)
    assert job.world == 4 and len(job.stages) == 2
    (res,) = run_plans([job])
    for got, want in zip(res.losses, res.reference_losses):
        assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    assert res.max_parameter_difference <= 1e-5


def test_an_unequal_plan_on_part_of_the_cluster_runs_on_its_first_devices(tmp_path):
    """Unequal meshes of 4, 1, 1 and 1 devices: the last of the 8 idles; 7 processes train as one."""
    from solver_planner.run.launch import run_plans

    layers = [{**x, "params": "8 MiB"} for x in UNEQUAL]
    model = model_file(tmp_path, "uneq", layers=layers)
    job = job_of(model, plan_file(tmp_path, model, "--schedule", "1f1b", "--meshes", "unequal"), steps=2)
    assert job.world == 7 and [len(s.ranks) for s in job.stages] == [4, 1, 1, 1]
    (res,) = run_plans([job])
    for got, want in zip(res.losses, res.reference_losses):
        assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    assert res.max_parameter_difference <= 1e-5


def test_both_boundary_paths_ran(results):
    """Plans whose boundaries pair rank k with rank k ran on torch's point-to-point lanes, the
    others on broadcasts: both paths are among the equivalence runs above."""
    lanes = {name: r.job.lanes for name, r in results.items() if len(r.job.stages) > 1}
    assert any(lanes.values()) and not all(lanes.values()), lanes
    assert not lanes["per-stage (d, t), uneven split"]


# -- refusals: no process starts ---------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "solver_planner", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model = model_file(folder, "tiny", transformer=TINY)
    return model, plan_file(folder, model, "--config", "2,2,2,4")


def _edit(plan: Path, folder: Path, change) -> Path:
    doc = yaml.safe_load(plan.read_text())
    change(doc)
    out = folder / "edited.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


EDITS = {
    # one rank's place in its stage mesh (so its groups) in the launch recipe
    "launch.ranks[3].tensor": lambda d: d["launch"]["ranks"][3].__setitem__("tensor", d["launch"]["ranks"][3]["tensor"] + 1),
    # one step of a gradient program
    "stages[0].gradient_program": lambda d: d["stages"][0].__setitem__(
        "gradient_program", "ReduceScatter(root, InsideGroup)"),
    # one boundary sender
    "boundaries[0].schedule[0].sender_device": lambda d: d["boundaries"][0]["schedule"][0].__setitem__(
        "sender_device", 1),
}


@pytest.mark.parametrize("path", list(EDITS))
def test_refuses_an_edited_plan(tiny_plan, tmp_path, path):
    model, plan = tiny_plan
    res = _cli("run", CLUSTER, model, _edit(plan, tmp_path, EDITS[path]), "--steps", "1")
    assert res.returncode == 1, res.stderr
    assert "check refuses the plan" in res.stderr and path in res.stderr, res.stderr


def test_refuses_more_processes_than_the_machine_hosts(tiny_plan):
    model, plan = tiny_plan
    res = _cli("run", CLUSTER, model, plan, "--max-ranks", "4", "--json")
    assert res.returncode == 2
    assert "8 ranks" in res.stdout and "can host 4" in res.stdout


def test_refuses_a_model_it_cannot_build(tmp_path):
    layers = [{"name": "a", "params": "64 KiB", "activations": "1 KiB", "flops": "1 MFLOP", "skip_to": ["c"]},
              {"name": "b", "repeat": 4, "params": "64 KiB", "activations": "1 KiB", "flops": "1 MFLOP"},
              {"name": "c", "params": "64 KiB", "activations": "1 KiB", "flops": "1 MFLOP"}]
    model = model_file(tmp_path, "skip", layers=layers)
    plan = plan_file(tmp_path, model, "--config", "2,2,2,4")
    res = _cli("run", CLUSTER, model, plan)
    assert res.returncode == 2
    assert "layer 'a'" in res.stderr and "skip_to" in res.stderr, res.stderr


# -- the command, and a rank that dies ---------------------------------------------------

def test_readme_commands(tmp_path):
    """The README's "From a plan to a running job" commands, as written (with --json added to
    the last), from another directory."""
    import json
    import re
    import shlex

    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "solver-planner run" in b)
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert [ln.split()[1] for ln in lines] == ["plan", "run"]
    for n, line in enumerate(lines):
        args = [str(ROOT / a) if a.startswith("specs/") else a for a in shlex.split(line)[1:]]
        if n == len(lines) - 1:
            args.append("--json")
        res = subprocess.run([sys.executable, "-m", "solver_planner", *args], capture_output=True, text=True,
                             cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    for s in data["steps"]:
        assert abs(s["loss"] - s["reference_loss"]) <= 1e-6 * s["reference_loss"]
    assert 0 <= data["max_parameter_difference"] <= 1e-4      # gpt-tiny trains with Adam
    assert data["measured_step_time"] > 0 and data["predicted_iteration_time"] > 0


def _descendants() -> list[str]:
    """Live processes below this one (zombies are dead), but multiprocessing's own helpers,
    its direct children that live as long as this process: the resource tracker and the
    fork server (the ranks are the fork server's children, so they are counted)."""
    import os

    parent, command = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if stat[0] != "Z":
            parent[int(pid)], command[int(pid)] = int(stat[1]), cmd
    me, out = os.getpid(), []
    for pid in parent:
        if pid == me:
            continue
        chain, p = [], pid
        while p in parent and p != me:
            chain.append(p)
            p = parent[p]
        if p != me:
            continue
        helper = chain[-1]   # the direct child of this process the chain goes through
        if len(chain) == 1 and ("resource_tracker" in command[pid] or "forkserver" in command[pid]):
            continue
        out.append(f"{pid} (via {helper}): {command[pid]}")
    return out


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_dead_rank_ends_the_run(tiny_plan, how):
    """A rank killed outright, or raising, ends the run: named with its step and action, the
    others stopped, no rank left."""
    import time

    from solver_planner.errors import PlannerError
    from solver_planner.run.launch import run_plan

    model, plan = tiny_plan
    job = job_of(model, plan, steps=3)
    start = time.monotonic()
    with pytest.raises(PlannerError) as info:
        run_plan(job, compare=False, timeout=20, fail=(5, 1, 2, how))
    message = str(info.value)
    assert message.startswith("rank 5 ") and "step 2" in message, message
    assert ("SIGKILL" in message) if how == "kill" else ("injected failure" in message), message
    assert "micro-batch 2" in message
    assert not _descendants()
    # the other ranks were stopped, not left to time out (20 s)
    assert time.monotonic() - start < 60


def test_emitted_launch_recipe_under_torchrun(tmp_path):
    """``plan --emit DIR`` writes launch_from_plan.py and plan.yaml; torchrun starts it from
    another directory and every rank's groups are the plan's."""
    import re
    import shutil

    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    emit = tmp_path / "emitted"
    res = _cli("plan", CLUSTER, ROOT / "specs/models/gpt-tiny.yaml", "--config", "2,2,2,4", "--emit", emit)
    assert res.returncode == 0, res.stderr
    commands = yaml.safe_load((emit / "commands.yaml").read_text())["commands"]
    assert any(str(emit / "launch_from_plan.py") in c for c in commands)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([torchrun, "--nproc-per-node", "8", str(emit / "launch_from_plan.py")], cwd=elsewhere,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(int(r) for r in re.findall(r"rank (\d+): stage \d .*?: ok", out.stdout)) == list(range(8))


@pytest.mark.gpu
def test_nccl_on_gpus(tiny_plan):
    """The same code path with --backend nccl and CUDA tensors, where 8 GPUs are present."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 8:
        pytest.skip(f"needs 8 CUDA GPUs; this machine has {torch.cuda.device_count()}")
    from solver_planner.run.launch import run_plan

    model, plan = tiny_plan
    res = run_plan(job_of(model, plan), backend="nccl")
    assert res.backend == "nccl" and res.max_parameter_difference <= 1e-4
