"""The spec fuzzer (benchmarks/fuzz.py) under hypothesis: every mutated shipped spec ends
with exit 0-3, no traceback, a file:line in every spec error, within the time limit.

The quick test (30 cases, in the ``-m "not slow"`` subset) mutates specs for the commands
that take under a second on the shipped specs; the slow test (300 cases, in the full suite
CI runs, derandomized there by tests/conftest.py's profile) every command.
``python benchmarks/fuzz.py`` runs 10 000.
"""

import random
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import fuzz  # noqa: E402

TARGETS = fuzz.targets()
# Commands that take seconds on the unmutated spec: the slow test only.
HEAVY = {("stages", "gpt3-39b.yaml"), ("stages", "u-transformer.yaml"), ("stages", "mlp16.yaml")}
QUICK = [(t, c) for t in TARGETS for c in t.commands if (c[0], t.spec.name) not in HEAVY]
EVERY = [(t, c) for t in TARGETS for c in t.commands]
QUICK_CASES = 30


@pytest.fixture(scope="module")
def workdir():
    fuzz.preload()          # once, before forking: each case starts at once
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def _check(case, rng, workdir, timeout):
    target, command = case
    data = fuzz.mutate(target.spec.read_text(encoding="utf-8"), rng)
    result = fuzz.fuzz_case(target, command, data, workdir, timeout)
    assert result.outcome == "ok", (
        f"{result.outcome} (exit {result.code}, {result.seconds:.1f} s): solver-planner {' '.join(result.args)}\n"
        f"--- spec ---\n{data.decode('utf-8', 'replace')[:3000]}\n--- stderr ---\n{result.stderr[-3000:]}")


def test_the_fuzzer_covers_every_shipped_spec_and_command():
    specs = {t.spec for t in TARGETS}
    shipped = set((ROOT / "specs").glob("*/*.yaml"))
    assert shipped <= specs
    commands = {c[0] if c[0] != "reduce" else "reduce verify" for t in TARGETS for c in t.commands}
    assert commands == {"validate", "show", "cost", "place", "reshard", "stages", "reduce verify"}


def test_the_judge_sorts_outcomes(tmp_path):
    spec = str(tmp_path / "c.yaml")
    assert fuzz.judge([], spec, None, "", False) == "hang"
    assert fuzz.judge([], spec, 1, "Traceback (most recent call last):\n  ...\nValueError: x", False) == "traceback"
    assert fuzz.judge([], spec, 137, "MemoryError", True) == "out-of-memory"
    assert fuzz.judge([], spec, 4, "", False) == "bad-exit"
    assert fuzz.judge([], spec, 2, f"error: {spec}: levels: bad", False) == "no-line"
    assert fuzz.judge([], spec, 2, f"error: {spec}:3: levels: bad", False) == "ok"


def test_the_runner_catches_what_it_should(tmp_path):
    """The forked runner reports a timeout, a crash and a clean spec error as such."""
    bad = tmp_path / "c.yaml"
    bad.write_text("name: x\nlevels: [{name: a, count: 2}]\n")
    code, stderr, _, oom = fuzz.run_case(["validate", str(bad)], timeout=30)
    assert code == 2 and f"{bad}:" in stderr and not oom
    code, _, seconds, _ = fuzz.run_case(["reduce", "verify", "--help"], timeout=30)
    assert code == 0


@settings(max_examples=QUICK_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(QUICK), rng=st.randoms(use_true_random=False))
def test_mutated_specs_quick(workdir, case, rng):
    _check(case, rng, workdir, timeout=30)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(EVERY), rng=st.randoms(use_true_random=False))
def test_mutated_specs_every_command(workdir, case, rng):
    _check(case, rng, workdir, timeout=60)


@pytest.mark.parametrize("seed", range(3))
def test_mutations_change_the_spec(seed):
    rng = random.Random(seed)
    changed = 0
    for target in TARGETS[:10]:
        text = target.spec.read_text(encoding="utf-8")
        changed += fuzz.mutate(text, rng) != fuzz.yaml.safe_dump(fuzz.yaml.safe_load(text), sort_keys=False,
                                                                 allow_unicode=True, width=120).encode()
    assert changed >= 7
