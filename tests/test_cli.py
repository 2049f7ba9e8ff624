import json

import jsonschema
import pytest
import yaml

from conftest import CLUSTERS, SPECS, run_cli


@pytest.mark.slow
def test_help_everywhere():
    for args in ([], ["validate"], ["show"], ["cost"], ["schema"]):
        result = run_cli(*args, "--help")
        assert result.returncode == 0, args
        assert "Usage" in result.stdout


def test_validate_shipped_specs():
    result = run_cli("validate", *sorted(SPECS.rglob("*.yaml")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok ") == len(list(SPECS.rglob("*.yaml")))


def test_validate_json_checks_model_against_the_one_cluster():
    result = run_cli("validate", CLUSTERS / "p2-a100-4x16.yaml", SPECS / "models" / "p2-example.yaml", "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["ok"] and [f["kind"] for f in data["files"]] == ["cluster", "model"]
    result = run_cli("validate", CLUSTERS / "p2-a100-2x16.yaml", SPECS / "models" / "p2-example.yaml", "--json")
    assert result.returncode == 2
    data = json.loads(result.stdout)
    assert not data["ok"] and "64 devices, but cluster 'p2-a100-2x16' has 32" in data["files"][1]["errors"][0]


def test_show_json():
    data = json.loads(run_cli("show", CLUSTERS / "p2-v100-2x8.yaml", "--json").stdout)
    assert data["devices"] == 16 and data["hosts"] == 2
    nic = next(ic for ic in data["interconnects"] if ic["name"] == "nic")
    assert nic["bandwidth"] == 8e9 and nic["via"] == ["pcie"] and nic["devices_per_port"] == 8


def test_show_gives_what_the_cost_model_reads_of_the_interconnects():
    """Each interconnect's per-collective efficiency and the cluster's collective_overlap:
    both feed the cost model, and both are shown as the spec gives them."""
    data = json.loads(run_cli("show", CLUSTERS / "dgx-a100-8x8.yaml", "--json").stdout)
    nvswitch = next(ic for ic in data["interconnects"] if ic["name"] == "nvswitch")
    assert nvswitch["efficiency"]["allreduce"] == 0.77 and nvswitch["efficiency"]["sendrecv"] == 0.60
    assert data["collective_overlap"] == 1.0
    out = run_cli("show", CLUSTERS / "dgx-a100-8x8.yaml").stdout
    assert "allreduce 0.77" in out and "collective_overlap: 1" in out


def test_show_table():
    out = run_cli("show", CLUSTERS / "p2-a100-2x16.yaml").stdout
    assert "32 x A100-SXM4-40GB" in out and "8 GB/s" in out and "one per node" in out


def test_cost_json_matches_the_library(a100):
    from solver_planner.cost import CostModel
    result = run_cli("cost", CLUSTERS / "p2-a100-2x16.yaml", "--collective", "allreduce", "--across", "node",
                     "--bytes", "1GiB", "--algorithm", "ring", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (row,) = data["results"]
    assert row["groups"] == 16 and row["group_size"] == 2
    assert row["time"] == CostModel(a100).collective("allreduce", a100.groups_across("node"), 2**30).time


def test_cost_level_within_and_table():
    result = run_cli("cost", CLUSTERS / "p2-a100-2x16.yaml", "--collective", "allreduce", "--level", "node",
                     "--bytes", "1GiB")
    assert result.returncode == 0
    assert "2 group(s) of 16 (within each node)" in result.stdout
    assert "ring" in result.stdout and "tree" in result.stdout


def test_cost_all_collectives():
    data = json.loads(run_cli("cost", CLUSTERS / "dgx-h100-4x8.yaml", "-c", "all", "--json").stdout)
    assert {r["collective"] for r in data["results"]} == {"allreduce", "reducescatter", "allgather", "reduce",
                                                          "broadcast"}


@pytest.mark.parametrize("kind, folder", [("cluster", "clusters"), ("model", "models")])
def test_schema_validates_every_shipped_spec(kind, folder, tmp_path):
    result = run_cli("schema", kind)
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    for path in (SPECS / folder).glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    out = tmp_path / "s.json"
    assert run_cli("schema", kind, "-o", out).returncode == 0
    assert json.loads(out.read_text()) == schema


def test_schema_rejects_bad_units():
    schema = json.loads(run_cli("schema", "cluster").stdout)
    spec = yaml.safe_load((CLUSTERS / "p2-a100-2x16.yaml").read_text())
    spec["interconnects"][0]["bandwidth"] = "fast"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, schema)


def test_schema_unknown_kind():
    result = run_cli("schema", "workload")
    assert result.returncode == 2 and "expected 'cluster' or 'model'" in result.stderr


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_plan_file_given_alone_is_named_with_its_cluster_and_model(tmp_path, command):
    """'check plan.yaml' (or with the cluster only) says the file is a plan for which cluster and
    model and in which order the files go, not only click's 'Missing argument'; a missing
    argument with no plan file among the inputs keeps click's message."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("format: solver-planner-plan\nversion: 5\ncluster: aws-p3.8xlarge-2\nmodel: gpt3-2.6b\n")
    for args in ([plan], [CLUSTERS / "aws-p3.8xlarge-2.yaml", plan]):
        res = run_cli(command, *args)
        assert res.returncode == 2
        assert (f"is a plan file for cluster 'aws-p3.8xlarge-2' and model 'gpt3-2.6b': give their spec files first,"
                f" '") in res.stderr and f" {command} CLUSTER.yaml MODEL.yaml {plan}'" in res.stderr, res.stderr
    res = run_cli(command, plan, "--json")
    assert "is a plan file" in json.loads(res.stdout)["error"]["message"]
    res = run_cli(command, CLUSTERS / "aws-p3.8xlarge-2.yaml")
    assert res.returncode == 2 and res.stderr.startswith("error: Missing argument 'model'.") \
        and "plan file" not in res.stderr


def test_one_micro_batch_is_singular():
    """`stages` of the tiny GPT on eight CPU processes: one stage of one micro-batch, said so."""
    r = run_cli("stages", CLUSTERS / "local-2x4.yaml", SPECS / "models" / "gpt-tiny.yaml", "--no-baselines")
    assert r.returncode == 0, r.stderr
    assert "1 stage of 2x4 meshes, 1 micro-batch of 16," in r.stdout, r.stdout


def test_a_cost_of_one_device_groups_says_why_in_one_sentence(tmp_path):
    """The warning once ended in 'try --across ' with nothing after it."""
    from conftest import one_device_cluster

    r = run_cli("cost", one_device_cluster(tmp_path))
    assert r.returncode == 0 and "'one' has one device" in r.stderr and "try --across" not in r.stderr
    r = run_cli("cost", CLUSTERS / "dgx-a100-8x8.yaml", "--level", "gpu")
    assert "has levels node, gpu: --level L groups the devices inside each L" in r.stderr
