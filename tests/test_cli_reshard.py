import json

import pytest

from conftest import CLUSTERS, SPECS, run_cli

P3X4 = CLUSTERS / "aws-p3.8xlarge-4.yaml"
MODEL = SPECS / "models" / "reshard-2x4-to-2x4.yaml"


def test_reshard_json_has_the_documented_shape():
    result = run_cli("reshard", P3X4, MODEL, "--name", "dim0-to-dim1", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"tasks", "makespan", "lower_bound", "status", "method", "solve_time", "schedule"} <= set(data)
    assert data["tasks"] == len(data["schedule"]) == 64
    assert data["status"] == "OPTIMAL" and data["method"] == "cp-sat"
    assert data["lower_bound"] <= data["makespan"] == max(row["end"] for row in data["schedule"])
    for row in data["schedule"]:
        assert {"slice", "sender_host", "receivers", "start", "end"} <= set(row)
        assert row["sender_host"] in (0, 1) and row["start"] < row["end"]
    # The resharding paper §5.1.2: reordering beats the naive schedule on this case.
    assert data["speedup"]["naive"] > 1.5 and data["speedup"]["send_recv"] >= 1


def test_reshard_all_cases_table_and_trace(tmp_path):
    trace = tmp_path / "reshard.json"
    result = run_cli("reshard", P3X4, MODEL, "--method", "greedy", "--trace", trace)
    assert result.returncode == 0, result.stderr
    for name in ("data-parallel", "data-to-operator", "dim0-to-dim1", "operator-parallel"):
        assert name in result.stdout
    assert "speedup" in result.stdout and "lower bound" in result.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) >= 6 and any("dim0-to-dim1" in e["name"] for e in spans)


def test_reshard_several_cases_json_lists_them():
    data = json.loads(run_cli("reshard", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml",
                              "--json", "--time-limit", "2").stdout)
    names = [r["name"] for r in data["reshardings"]]
    assert names == ["data-parallel-uneven", "operator-to-data-uneven"]
    assert all(r["padding"] for r in data["reshardings"])  # 1024 rows over 3 or 12 tiles: said, not hidden


def _model(tmp_path, label, src, dst, shape="[8, 8]"):
    path = tmp_path / f"{label}.yaml"
    path.write_text(f"name: bad\nresharding:\n  - name: t\n    shape: {shape}\n    dtype: float32\n"
                    f"    src: {src}\n    dst: {dst}\n")
    return path


@pytest.mark.slow
def test_reshard_bad_input_exits_2_with_the_line(tmp_path):
    cases = {
        "overlap": (_model(tmp_path, "overlap", "{hosts: [0, 1], devices_per_host: 4, spec: [S0, R]}",
                           "{hosts: [1, 2], devices_per_host: 4, spec: [R, R]}"), "overlap"),
        "rank": (_model(tmp_path, "rank", "{hosts: [0], devices_per_host: 4, spec: [S0]}",
                        "{hosts: [1], devices_per_host: 4, spec: [R, R]}"), "rank 2"),
        "axis twice": (_model(tmp_path, "axis-twice", "{hosts: [0], devices_per_host: 4, spec: [S0, S01]}",
                              "{hosts: [1], devices_per_host: 4, spec: [R, R]}"), "mesh axis 0 is used twice"),
        "too many hosts": (_model(tmp_path, "hosts", "{hosts: [0], devices_per_host: 4, spec: [S0, R]}",
                                  "{hosts: [1, 2, 3, 4], devices_per_host: 4, spec: [R, R]}"), "does not exist"),
        "too many devices": (_model(tmp_path, "devices", "{hosts: [0], devices_per_host: 8, spec: [S0, R]}",
                                    "{hosts: [1], devices_per_host: 4, spec: [R, R]}"), "do not fit"),
    }
    for label, (path, message) in cases.items():
        result = run_cli("reshard", P3X4, path)
        assert result.returncode == 2, (label, result.stdout, result.stderr)
        assert message in result.stderr and f"{path.name}:" in result.stderr, (label, result.stderr)
        assert "Traceback" not in result.stderr
    result = run_cli("reshard", P3X4, MODEL, "--method", "magic")
    assert result.returncode == 2 and "unknown method" in result.stderr
    result = run_cli("reshard", P3X4, SPECS / "models" / "dp16.yaml")
    assert result.returncode == 2 and "no resharding" in result.stderr


def test_validate_checks_meshes_against_the_one_cluster_given():
    ok = run_cli("validate", CLUSTERS / "aws-p3.8xlarge-5.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml")
    assert ok.returncode == 0 and "2 resharding(s)" in ok.stdout
    small = run_cli("validate", CLUSTERS / "aws-p3.8xlarge-3.yaml", SPECS / "models" / "reshard-2x4-to-3x4.yaml")
    assert small.returncode == 2
    assert "reshard-2x4-to-3x4.yaml:12: resharding[0].dst.hosts[1]: host 3 does not exist" in small.stderr
