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
    device: {name: A100, flops: 312 TFLOP/s, memory: 40 GiB, memory_bandwidth: 1555 GB/s}
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


# -- bad input in bounded time and memory (issue 15) ----------------------------------------

def alias_bomb(levels=8, width=9):
    """Nested anchors: level k expands to width**(k+1) values (a "billion laughs")."""
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_the_alias_that_crosses_the_limit():
    from solver_planner.spec.source import MAX_NODES
    text = CLUSTER + alias_bomb()
    issue = error_of(load_cluster_spec, text).issues[0]
    assert issue.line == 9 + 6  # a6: 9**7 = 4.8 million values
    assert f"more than {MAX_NODES:,} values" in issue.message and "alias" in issue.message


def test_aliases_below_the_limit_still_load():
    text = CLUSTER.replace("name: t", "name: &n t") + "description: *n\n"
    assert load_cluster_spec("spec.yaml", text).description == "t"


def test_duplicate_key_walk_visits_an_aliased_node_once():
    import yaml
    from solver_planner.spec.source import check_duplicates
    # 60 mappings, each naming the previous one twice: 2**60 paths, 61 nodes.
    lines = ["m0: &m0 {x: 1}"] + [f"m{k}: &m{k} {{a: *m{k - 1}, b: *m{k - 1}}}" for k in range(1, 61)]
    check_duplicates(yaml.compose("\n".join(lines), Loader=yaml.SafeLoader), "spec.yaml")  # returns at once
    lines[0] = "m0: &m0 {x: 1, x: 2}"
    with pytest.raises(SpecError, match="spec.yaml:1: m0.x: duplicate key 'x'"):
        check_duplicates(yaml.compose("\n".join(lines), Loader=yaml.SafeLoader), "spec.yaml")


def test_an_alias_inside_its_own_anchor_is_refused():
    issue = error_of(load_cluster_spec, CLUSTER + "loop: &loop [1, *loop]\n").issues[0]
    assert issue.line == 9 and "cycle" in issue.message


def test_deep_nesting_is_refused_without_recursion_error():
    from solver_planner.spec.source import MAX_DEPTH
    text = CLUSTER.replace("levels:\n", "levels: " + "[" * 500 + "]" * 500 + "\n", 1)
    issue = error_of(load_cluster_spec, text).issues[0]
    assert issue.line == 2 and f"nested more than {MAX_DEPTH} deep" in issue.message


@pytest.mark.parametrize("raw, line, column, what", [
    (b"name: t\nlevels: [a,\x00]\n", 2, 12, "a NUL byte"),
    (b"name: t\n# caf\xe9\n", 2, 6, "byte 0xe9 is not valid UTF-8"),
    (b"name: \xc3\xa9t\xc3\xa9\nx: \xc3\xa9\xff\n", 2, 5, "byte 0xff is not valid UTF-8"),
    (b"name: t\ndescription: a\x07b\n", 2, 15, "control character U+0007"),
])
def test_bad_bytes_are_named_by_line_and_column(tmp_path, raw, line, column, what):
    path = tmp_path / "c.yaml"
    path.write_bytes(raw)
    with pytest.raises(SpecError) as info:
        load_cluster_spec(path)
    assert str(info.value).startswith(f"{path}:{line}: column {column}: ")
    assert what in str(info.value) and "\n" not in str(info.value)


def test_oversized_file_is_refused_before_parsing(tmp_path):
    from solver_planner.spec.source import MAX_FILE_BYTES
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER + "#" * MAX_FILE_BYTES)
    with pytest.raises(SpecError, match="larger than 1 MiB"):
        load_cluster_spec(path)


def test_values_python_cannot_read_are_spec_errors():
    issue = error_of(load_cluster_spec, CLUSTER.replace("name: t", "name: 2001-13-45")).issues[0]
    assert issue.line == 1 and "cannot read the value '2001-13-45'" in issue.message
    issue = error_of(load_cluster_spec, CLUSTER.replace("count: 16", "count: " + "9" * 5000)).issues[0]
    assert issue.line == 4 and "cannot read the value" in issue.message


@pytest.mark.parametrize("old, new, line, path, expected", [
    # sizes beyond what any command handles
    ("count: 16", "count: 18446744073709551616", 4, "levels[1].count", "expected a value <= 100000"),
    ("count: 16", "count: 1000000", 4, "levels[1].count", "expected a value <= 100000"),
    ("count: 2}", "count: 10000}", 2, "levels", "10000 x 16 = 160,000 devices; at most 100,000"),
    # booleans are not numbers
    ("count: 16", "count: true", 4, "levels[1].count", "expected a number, got true"),
    ("memory: 40 GiB", "memory: true", 5, "device.memory", "expected a size such as"),
    # numbers beyond float range, and implausible magnitudes
    ("memory: 40 GiB", "memory: " + "9" * 401, 5, "device.memory", "a size out of range"),
    ("memory: 40 GiB", "memory: 1e-300", 5, "device.memory", "expected 0 or 1 B to 1 EiB"),
    ("bandwidth: 8 GB/s", "bandwidth: 1e-300", 8, "interconnects[1].bandwidth", "expected 0 or 1 B/s to 1 PB/s"),
    ("latency: 2us", "latency: 1e300", 7, "interconnects[0].latency", "expected 0 or 1 ps to 1 hour"),
    ("latency: 2us", "latency: -0.0", 7, "interconnects[0].latency", "expected a non-negative duration"),
    ("flops: 312 TFLOP/s", "flops: .inf", 5, "device.flops", "out of range"),
    ("sharing: node", "sharing: 99999999999999999999 devices", 8, "interconnects[1].sharing", "expected 'device'"),
])
def test_cluster_bounds(old, new, line, path, expected):
    err = error_of(load_cluster_spec, CLUSTER.replace(old, new, 1))
    issue = err.issues[0]
    assert (issue.line, issue.path) == (line, path)
    assert expected in issue.message


RESHARD = textwrap.dedent("""\
    name: r
    resharding:
      - name: act
        shape: [1024, 1024]
        src: {hosts: [0], devices_per_host: 4, spec: [S1, R]}
        dst: {hosts: [1], devices_per_host: 4, spec: [R, S1]}
    """)

LAYERS = textwrap.dedent("""\
    name: l
    layers:
      - {name: block, repeat: 8, flops: 1 GFLOP, activations: 1 MiB}
    training: {global_batch: 64}
    """)


@pytest.mark.parametrize("text, old, new, line, path, expected", [
    (MODEL, "size: 4", "size: true", 4, "parallelism.axes[0].size", "expected a number, got true"),
    (MODEL, "size: 4", "size: 1000000", 4, "parallelism.axes[0].size", "expected a value <= 100000"),
    (MODEL, "size: 4", "size: 10000", 3, "parallelism.axes", "multiply to 160,000 devices"),
    (MODEL, "8 GiB}", "8 GiB, weight: true}", 7, "reductions[0].weight", "expected a number, got true"),
    (MODEL, "8 GiB}", "8 GiB, weight: .inf}", 7, "reductions[0].weight", "expected a finite number"),
    (MODEL, "8 GiB}", "8 GiB, weight: 1e300}", 7, "reductions[0].weight", "expected a value <= 1000000"),
    (RESHARD, "devices_per_host: 4, spec: [S1", "devices_per_host: 1000000000, spec: [S1", 5,
     "resharding[0].src.devices_per_host", "expected a value <= 100000"),
    (RESHARD, "hosts: [0]", "hosts: [0, 1, 2]", 6, "resharding[0].dst",
     "the source and destination meshes overlap (4 devices, e.g. host 1 device 0)"),
    (RESHARD, "hosts: [0]", "hosts: [18446744073709551616]", 5, "resharding[0].src.hosts[0]", "expected a host index below"),
    (RESHARD, "[1024, 1024]", f"[{10**100}, 4]", 4, "resharding[0].shape",
     "a tensor of about 10**101 bytes; at most 2**50"),
    (LAYERS, "repeat: 8", "repeat: 20000", 3, "layers[0].repeat", "expected a value <= 10000"),
    (LAYERS, "repeat: 8", "repeat: 6000, flops: 1, activations: 1}\n  - {name: more, repeat: 6000", 2, "layers",
     "12,000 layers after 'repeat'; at most 10,000"),
    (LAYERS, "global_batch: 64", "global_batch: 2147483648", 4, "training.global_batch", "expected a value <= 1048576"),
        (LAYERS, "global_batch: 64}", "global_batch: 1048576, microbatches: 131072}", 4, "training.microbatches",
         "131072 micro-batches exceed the limit of 65536"),
    (LAYERS, "layers:\n  - {name: block, repeat: 8, flops: 1 GFLOP, activations: 1 MiB}",
     "transformer: {layers: 9223372036854775808, hidden: 64, heads: 4, sequence: 128, vocab: 1000}", 2,
     "transformer.layers", "expected a value <= 10000"),
])
def test_model_bounds(text, old, new, line, path, expected):
    assert old in text
    issue = error_of(load_model_spec, text.replace(old, new, 1)).issues[0]
    assert (issue.line, issue.path) == (line, path)
    assert expected in issue.message


def test_a_file_with_many_problems_reports_a_bounded_number():
    from solver_planner.spec.base import MAX_ISSUES
    text = "name: x\nlayers:\n" + "  - {name: x}\n" * 1000 + "training: {global_batch: 8}\n"
    err = error_of(load_model_spec, text)
    assert len(err.issues) == MAX_ISSUES and err.issues[0].line == 3
    text = "name: x\nlayers:\n" + "  - {name: x}\n" * 10_001 + "training: {global_batch: 8}\n"
    assert str(error_of(load_model_spec, text)) == "spec.yaml:2: layers: expected at most 10,000 entries, got 10001"


BAD_FILES = {
    "bomb": MODEL + alias_bomb(),
    "deep": MODEL.replace("reductions:\n", "reductions: " + "[" * 500 + "]" * 500 + "\n", 1),
    "nul": MODEL.replace("name: grads", "name: gr\x00ads"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["validate", "reduce verify"])
def test_cli_refuses_hostile_files_in_one_line(tmp_path, kind, command):
    cluster, model, program = tmp_path / "c.yaml", tmp_path / "m.yaml", tmp_path / "p.yaml"
    cluster.write_text(CLUSTER.replace("count: 2}", "count: 4}"))
    model.write_text(BAD_FILES[kind])
    program.write_text("steps: []\n")
    args = [cluster, model] if command == "validate" else ["verify", cluster, model, program]
    result = run_cli(*command.split()[:1], *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {model}:"), result.stderr


def test_libyaml_reads_what_the_bounded_reader_reads(monkeypatch):
    """spec/source.py composes plain YAML with libyaml: the same data and the same line for
    every key as the pure-Python reader, on every shipped spec and example; YAML with an
    anchor, an alias or a tag, or nested too deep, is left to the bounded reader."""
    from pathlib import Path

    from solver_planner.spec import source

    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "specs").rglob("*.yaml")) + sorted((root / "examples").glob("*.yaml"))
    assert len(files) > 20

    def keys(data, path=()):
        yield path
        if isinstance(data, dict):
            for k, v in data.items():
                yield from keys(v, path + (k,))
        elif isinstance(data, list):
            for i, v in enumerate(data):
                yield from keys(v, path + (i,))

    for f in files:
        fast, fast_source = source.load_yaml(f)
        with monkeypatch.context() as m:
            m.setattr(source, "_compose_fast", lambda text: None)
            slow, slow_source = source.load_yaml(f)
        assert fast == slow, f
        assert [fast_source.line(p) for p in keys(fast)] == [slow_source.line(p) for p in keys(slow)], f
    assert source._compose_fast("a: &x 1\nb: *x\n") is None
    assert source._compose_fast("a: !!str 1\n") is None
    assert source._compose_fast("a: " + "[" * 80 + "]" * 80 + "\n") is None
    assert source._compose_fast("a: [1, 2]\n") is not None


def test_keys_equal_once_loaded_are_duplicates():
    """``1`` and ``0x1`` are one key in the data: the second is refused, as a repeated name is."""
    from solver_planner.spec.source import load_yaml

    with pytest.raises(SpecError, match=r"spec.yaml:3: .*duplicate key '0x1' \(first given on line 2\)"):
        load_yaml("spec.yaml", "m:\n  1: a\n  0x1: b\n")
    assert load_yaml("spec.yaml", "m:\n  1: a\n  '0x1': b\n")[0] == {"m": {1: "a", "0x1": "b"}}


@pytest.mark.parametrize("value", ["1", "0", "'true'", "'no'"])
def test_a_switch_is_true_or_false(value):
    """fused_qkv: 1 and sequence_parallel: "true" planned as true (pydantic's lax booleans):
    a switch is YAML's true or false (yes and no read as those), anything else is a slip."""
    text = ("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, vocab: 100, sequence: 16}\n"
            f"training:\n  global_batch: 8\n  sequence_parallel: {value}\n")
    err = str(error_of(load_model_spec, text))
    assert ":5: training.sequence_parallel: expected true or false" in err
    assert load_model_spec("spec.yaml", text.replace(f"parallel: {value}", "parallel: yes")).training.sequence_parallel


@pytest.mark.parametrize("training, hint", [
    ("dtype: bf16", "got 'bf16' (did you mean 'bfloat16'?)"),
    ("dtype: FP16", "got 'FP16' (did you mean 'float16'?)"),
    ("optimizer: AdamW", "got 'AdamW' (did you mean 'adam'? It covers AdamW"),
    ("optimizer: sdg", "got 'sdg' (did you mean 'sgd'?)"),
    ("dtype: int8", "got 'int8'"),
])
def test_a_choice_written_as_other_tools_write_it_gets_the_spelling_here(tmp_path, training, hint):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\ntransformer: {layers: 2, hidden: 64, heads: 4, sequence: 16, vocab: 256}\n"
                    f"training: {{global_batch: 8, {training}}}\n")
    with pytest.raises(SpecError) as err:
        load_model_spec(path)
    message = err.value.issues[0].message
    assert hint in message, message
    assert ("did you mean" in message) == (training != "dtype: int8"), message


def test_a_name_out_of_the_pattern_and_an_empty_list_are_said_in_words(tmp_path):
    """pydantic's own text reached users: "String should match pattern '^[A-Za-z_]...'" and
    "expected a list that should have at least 1 item after validation, not 0"."""
    from conftest import run_cli

    bad = tmp_path / "m.yaml"
    bad.write_text("name: m\nparallelism:\n  axes:\n    - {name: données, size: 8}\nreductions: []\n")
    r = run_cli("validate", bad)
    assert r.returncode == 2 and "axes[0].name: expected a name of ASCII letters" in r.stderr
    assert "should match pattern" not in r.stderr
    bad.write_text("name: m\nparallelism:\n  axes: []\n")
    r = run_cli("validate", bad)
    assert r.returncode == 2 and f"{bad}:3: parallelism.axes: expected at least 1 entry, got 0" in r.stderr


def test_a_tied_layer_of_another_size_is_warned_about(tmp_path):
    """Tied layers share one set of weights; a copy of another size was accepted silently
    and priced at its own size (a 1 GiB head tied to a 250 MiB table)."""
    from solver_planner.spec.plausible import implausible

    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent("""\
        name: t
        training: {global_batch: 64, dtype: float16, optimizer: adam}
        layers:
          - {name: embed, flops: 0 FLOP, params: 250 MiB, activations: 10 MiB}
          - {name: block, repeat: 6, flops: 0.5 TFLOP, params: 150 MiB, activations: 10 MiB}
          - {name: head, flops: 0.1 TFLOP, params: 1 GiB, activations: 10 MiB, tied_to: embed}
        """))
    notes = implausible(load_model_spec(path))
    assert len(notes) == 1 and ":6: layers[2].params:" in notes[0] and "('embed') has 262,144,000" in notes[0]
    r = run_cli("validate", path)
    assert r.returncode == 0 and "tied layers share one set of weights" in r.stderr
    path.write_text(path.read_text().replace("params: 1 GiB", "params: 250 MiB"))
    assert implausible(load_model_spec(path)) == []
