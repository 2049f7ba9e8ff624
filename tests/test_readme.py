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
