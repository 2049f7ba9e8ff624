"""Every kind of bad input is refused with file:line: key.path: what was expected."""

import textwrap

import pytest

from solver_planner.errors import SpecError
from solver_planner.spec import load_cluster_spec, load_model_spec

from conftest import run_cli

CLUSTER = textwrap.dedent("""\
    name: t
    levels:
      - {name: node, count: 2}
      - {name: gpu, count: 16}
    device: {name: A100, flops: 312 TFLOP/s, memory: 40 GiB}
    interconnects:
      - {name: nvswitch, level: gpu, bandwidth: 270 GB/s, latency: 2us}
      - {name: nic, level: node, bandwidth: 8 GB/s, latency: 10us, sharing: node}
    """)

MODEL = textwrap.dedent("""\
    name: example
    parallelism:
      axes:
        - {name: data, size: 4}
        - {name: model, size: 16}
    reductions:
      - {name: grads, axes: [data], bytes: 8 GiB}
    """)


def error_of(loader, text):
    with pytest.raises(SpecError) as info:
        loader("spec.yaml", text)
    return info.value


@pytest.mark.parametrize("old, new, line, path, expected", [
    # wrong type
    ("count: 16", "count: sixteen", 4, "levels[1].count", "expected an integer, got 'sixteen'"),
    # bad units
    ("latency: 2us", "latency: 2 parsecs", 7, "interconnects[0].latency", "expected a duration such as"),
    ("bandwidth: 8 GB/s", "bandwidth: 8 GB", 8, "interconnects[1].bandwidth", "expected a bandwidth such as '100Gbps'"),
    ("memory: 40 GiB", "memory: 40 GiB/s", 5, "device.memory", "expected a size such as"),
    # unknown key
    ("latency: 2us}", "latency: 2us, colour: red}", 7, "interconnects[0].colour", "unknown key 'colour'; expected one of: name, level"),
    # missing field
    ("{name: node, count: 2}", "{name: node}", 3, "levels[0].count", "missing required key"),
    # interconnect naming a level that does not exist
    ("level: node, bandwidth", "level: rack, bandwidth", 8, "interconnects[1].level", "no level named 'rack'"),
    # sharing that is neither device, a level nor 'K devices'
    ("sharing: node", "sharing: rack", 8, "interconnects[1].sharing", "expected 'device', a level name"),
    # non-positive bandwidth
    ("bandwidth: 8 GB/s", "bandwidth: 0 GB/s", 8, "interconnects[1].bandwidth", "expected a value > 0"),
    # count < 1
    ("count: 2}", "count: 0}", 3, "levels[0].count", "expected a value >= 1"),
])
def test_cluster_errors_name_file_line_key_and_expectation(old, new, line, path, expected):
    assert old in CLUSTER
    err = error_of(load_cluster_spec, CLUSTER.replace(old, new, 1))
    issue = err.issues[0]
    assert (issue.file, issue.line, issue.path) == ("spec.yaml", line, path)
    assert expected in issue.message
    assert str(err).startswith(f"spec.yaml:{line}: {path}: ")


def test_level_without_interconnect():
    text = CLUSTER.replace("  - {name: nic, level: node, bandwidth: 8 GB/s, latency: 10us, sharing: node}\n", "")
    issue = error_of(load_cluster_spec, text).issues[0]
    assert (issue.line, issue.path) == (3, "levels[0]")
    assert "no interconnect serves it" in issue.message


def test_two_interconnects_on_one_level():
    text = CLUSTER + "  - {name: nic2, level: node, bandwidth: 8 GB/s}\n"
    issue = error_of(load_cluster_spec, text).issues[0]
    assert (issue.line, issue.path) == (9, "interconnects[2].level")


def test_via_must_name_an_interconnect():
    text = CLUSTER.replace("sharing: node}", "sharing: node, via: [pcie]}")
    issue = error_of(load_cluster_spec, text).issues[0]
    assert (issue.line, issue.path) == (8, "interconnects[1].via[0]")
    assert "no interconnect named 'pcie'" in issue.message


def test_duplicate_keys_are_refused_not_overwritten():
    issue = error_of(load_cluster_spec, CLUSTER + "name: again\n").issues[0]
    assert (issue.line, issue.path) == (9, "name")
    assert "duplicate key 'name' (first given on line 1)" in issue.message


def test_duplicate_level_names():
    issue = error_of(load_cluster_spec, CLUSTER.replace("name: gpu", "name: node")).issues[0]
    assert (issue.line, issue.path) == (4, "levels[1].name")


def test_object_tags_are_refused():
    err = error_of(load_cluster_spec, CLUSTER.replace("name: t", "name: !!python/object/apply:os.system [ls]"))
    assert err.issues[0].line == 1
    assert "no object tags" in err.issues[0].message


def test_yaml_syntax_error_has_a_line():
    err = error_of(load_cluster_spec, CLUSTER.replace("device: {", "device: ["))
    assert err.issues[0].line == 5
    assert "YAML error" in err.issues[0].message


@pytest.mark.parametrize("text, message", [("", "the file is empty"), ("- 1\n- 2\n", "expected a mapping")])
def test_empty_or_non_mapping(text, message):
    assert message in str(error_of(load_cluster_spec, text))


def test_several_problems_are_counted_in_one_line():
    text = CLUSTER.replace("count: 16", "count: x").replace("latency: 2us", "latency: soon")
    err = error_of(load_cluster_spec, text)
    assert len(err.issues) == 2
    assert "\n" not in str(err) and str(err).endswith("(and 1 more problem)")


def test_missing_file():
    with pytest.raises(SpecError, match="nope.yaml: no such file"):
        load_cluster_spec("nope.yaml")


@pytest.mark.parametrize("old, new, line, path, expected", [
    ("axes: [data]", "axes: [dat]", 7, "reductions[0].axes[0]", "no axis named 'dat'; expected one of: data, model"),
    ("8 GiB", "lots", 7, "reductions[0].bytes", "expected a size such as"),
    ("size: 4", "size: four", 4, "parallelism.axes[0].size", "expected an integer"),
    ("name: model", "name: data", 5, "parallelism.axes[1].name", "axis 'data' is named twice"),
    ("axes: [data]", "axes: [data, data]", 7, "reductions[0].axes[1]", "listed twice"),
    ("bytes: 8 GiB}", "bytes: 8 GiB, when: now}", 7, "reductions[0].when", "unknown key 'when'"),
    ("    - {name: model, size: 16}\n", "", 6, "reductions[0].bytes", "expected a size"),
])
def test_model_errors(old, new, line, path, expected):
    text = MODEL.replace(old, new, 1)
    if not new:
        text = text.replace("8 GiB", "a lot")
    issue = error_of(load_model_spec, text).issues[0]
    assert (issue.line, issue.path) == (line, path)
    assert expected in issue.message


def test_axes_product_must_equal_device_count(tmp_path):
    from solver_planner.spec import check_fits
    spec = load_model_spec("m.yaml", MODEL)
    with pytest.raises(SpecError) as info:
        check_fits(spec, 32, "t")
    issue = info.value.issues[0]
    assert (issue.file, issue.line, issue.path) == ("m.yaml", 3, "parallelism.axes")
    assert "4 x 16 = 64 devices, but cluster 't' has 32" in issue.message
    check_fits(spec, 64, "t")  # fits: no error


# -- through the real command: one line, no traceback, exit 2 ---------------------------

@pytest.mark.parametrize("command", ["validate", "show", "cost"])
def test_cli_prints_one_line_and_exits_2(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CLUSTER.replace("bandwidth: 8 GB/s", "bandwidth: quick"))
    result = run_cli(command, bad)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {bad}:8: interconnects[1].bandwidth: expected a bandwidth such as '100Gbps' or "
                     f"'270 GB/s', got 'quick'"]


def test_cli_model_that_does_not_fit(tmp_path):
    cluster, model = tmp_path / "c.yaml", tmp_path / "m.yaml"
    cluster.write_text(CLUSTER)
    model.write_text(MODEL)
    result = run_cli("validate", cluster, model)
    assert result.returncode == 2
    assert f"{model}:3: parallelism.axes: axis sizes 4 x 16 = 64 devices" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_bad_option_value_exits_2(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    for args in (["--bytes", "lots"], ["--level", "rack"], ["-c", "alltoall"], ["--algorithm", "star"]):
        result = run_cli("cost", cluster, *args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith("error: "), result.stderr
