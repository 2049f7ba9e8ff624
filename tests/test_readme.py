"""The README's commands and example stay true."""

import os
import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def shell_blocks():
    return re.findall(r"```sh\n(.*?)```", README, re.S)


def test_ci_runs_exactly_the_readme_test_command():
    test_command = shell_blocks()[1].strip()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_setup_command_uses_a_shipped_spec():
    setup = shell_blocks()[0]
    for path in re.findall(r"specs/\S+\.yaml", setup):
        assert (ROOT / path).is_file(), path


def test_readme_python_example_runs(tmp_path, monkeypatch):
    # the simulator's example (other Python blocks need torch.distributed or a plan file)
    code = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "timeline" in b)
    monkeypatch.chdir(ROOT)
    code = code.replace('"step.trace.json"', repr(str(tmp_path / "step.trace.json")))
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    timeline = namespace["timeline"]
    # The all-reduce waits for the reduce-scatter, the optimizer for the all-reduce.
    assert timeline[1].start == timeline[0].end and timeline[2].start == timeline[1].end
    assert os.path.getsize(tmp_path / "step.trace.json") > 0


def test_readme_model_spec_blocks_load(tmp_path):
    """Every YAML block of the README that is a model spec (or the stages part of one, which
    the README shows without a name) loads with the spec loader: its keys and defaults exist."""
    import yaml

    from solver_planner.spec.model import load_model_spec

    keys = {"parallelism", "reductions", "layers", "transformer", "training"}
    loaded = []
    for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", README, re.S)):
        data = yaml.safe_load(block)
        if not isinstance(data, dict) or not keys & set(data) or set(data) - keys - {"name", "description"}:
            continue
        data.setdefault("name", f"readme-{i}")
        path = tmp_path / f"block{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        spec = load_model_spec(path)
        loaded.append(spec)
    # the parallelism example and the stages example, whose training section shows every option
    assert len(loaded) >= 2
    assert any(s.training is not None and s.training.gradient_accumulation == "add" for s in loaded)
