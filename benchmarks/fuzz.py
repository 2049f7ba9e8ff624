"""Spec fuzzer: mutate every shipped spec and run the commands that read it.

Each case takes one spec under ``specs/`` (a cluster, or a model with a cluster it fits),
mutates it (keys, types, magnitudes, units, YAML structure, bytes), runs one command that
reads it (``validate``, ``show``, ``cost``, ``place``, ``reshard``, ``stages``,
``reduce verify``) in a forked copy of this process with a time and memory limit, and
sorts the outcome:

* ``ok``: exit 0, 1, 2 or 3, no traceback, and every spec error (exit 2 naming a spec
  file) says ``file:line``;
* ``traceback``, ``hang`` (over the time limit), ``out-of-memory`` (over the memory
  limit), ``bad-exit`` (another exit code), ``no-line`` (a spec error without a line).

Run ``python benchmarks/fuzz.py`` (10 000 cases, seed 0; ``--cases``, ``--seed``,
``--timeout``); it prints the counts and the first failures with their
reproducers (``--keep DIR`` writes each failing spec there).  ``tests/test_fuzz.py``
drives the same mutations from hypothesis.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import io
import math
import os
import random
import re
import resource
import select
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
PROGRAMS = ROOT / "examples"

OUTCOMES = ("ok", "traceback", "hang", "out-of-memory", "bad-exit", "no-line")
MEMORY_LIMIT = 3 * 2**30        # address space of one case, on top of what the fork maps
TIMEOUT = 30.0                   # seconds of one case


# What the fuzzed commands import: the CLI imports a command's solvers only when the command
# runs, so these are loaded once before forking, and each case starts at once.
PRELOAD = ("solver_planner.cli", "solver_planner.plan", "solver_planner.stages", "solver_planner.placement",
           "solver_planner.reduction", "solver_planner.resharding", "solver_planner.simulate",
           "solver_planner.subcluster", "solver_planner.collective_arrays", "z3")


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


# -- which commands read which spec ------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A spec to mutate and the commands that read it: ``args`` with ``{spec}`` where the
    mutated file goes."""

    spec: Path
    commands: tuple[tuple[str, ...], ...]


def _load(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _fits(model: dict, cluster: dict) -> bool:
    """Does the (unmutated) model fit the cluster: axis product and mesh hosts."""
    devices = math.prod(level["count"] for level in cluster["levels"])
    axes = (model.get("parallelism") or {}).get("axes")
    if axes and math.prod(a["size"] for a in axes) != devices:
        return False
    if model.get("resharding"):
        per_host = cluster["levels"][-1]["count"]
        hosts = devices // per_host
        for task in model["resharding"]:
            for side in ("src", "dst"):
                mesh = task[side]
                if max(mesh["hosts"]) >= hosts or mesh.get("first_device", 0) + mesh["devices_per_host"] > per_host:
                    return False
    return True


# The cluster each model is run on when it fits (else the smallest one it fits), and the
# shipped reduction programs with the cluster and model they are written for.
PREFERRED_CLUSTER = {"dp16.yaml": "p2-v100-2x8.yaml", "local-2x4.yaml": "aws-p3.8xlarge-2.yaml",
                     "gpt3-2.6b.yaml": "aws-p3.8xlarge-2.yaml", "u-transformer.yaml": "aws-p3.8xlarge-2.yaml",
                     "mlp16.yaml": "dgx-h100-4x8.yaml", "gpt3-39b.yaml": "dgx-h100-4x8.yaml",
                     "gpt3-175b.yaml": "dgx-h100-4x8.yaml", "gpt3-175b-megatron.yaml": "dgx-h100-4x8.yaml"}
PROGRAM_SETUPS = [("p2-v100-2x8.yaml", "dp16.yaml", "hierarchical-allreduce-2x8.yaml"),
                  ("p2-v100-2x8.yaml", "dp16.yaml", "broken-allreduce-2x8.yaml"),
                  ("aws-p3.8xlarge-2.yaml", "local-2x4.yaml", "double-count-2x4.yaml"),
                  ("aws-p3.8xlarge-2.yaml", "local-2x4.yaml", "unsorted-groups-2x4.yaml")]


def targets() -> list[Target]:
    """Every shipped spec (and reduction program), each with the commands that read it."""
    clusters = sorted(SPECS.glob("clusters/*.yaml")) + sorted(SPECS.glob("resharding/aws-*.yaml"))
    models = sorted(SPECS.glob("models/*.yaml")) + sorted(SPECS.glob("resharding/reshard-*.yaml"))
    out = []
    loaded = {c: _load(c) for c in clusters}
    by_name = {c.name: c for c in clusters}
    for c in clusters:
        out.append(Target(c, (("validate", "{spec}"), ("show", "{spec}"), ("show", "--json", "{spec}"),
                              ("cost", "{spec}"))))
    for m in models:
        data = _load(m)
        fitting = [c for c in clusters if _fits(data, loaded[c])]
        fitting.sort(key=lambda c: (c.name != PREFERRED_CLUSTER.get(m.name),
                                    math.prod(level["count"] for level in loaded[c]["levels"])))
        if not fitting:
            continue
        c = str(fitting[0])
        commands: list[tuple[str, ...]] = [("validate", c, "{spec}")]
        if data.get("parallelism"):
            commands.append(("place", c, "{spec}"))
        for cluster, model, program in PROGRAM_SETUPS:
            if model == m.name:
                commands.append(("reduce", "verify", str(by_name[cluster]), "{spec}", str(PROGRAMS / program)))
        if data.get("resharding"):
            commands.append(("reshard", c, "{spec}"))
        if data.get("layers") or data.get("transformer"):
            commands.append(("stages", c, "{spec}"))
        out.append(Target(m, tuple(commands)))
    for cluster, model, program in PROGRAM_SETUPS:
        out.append(Target(PROGRAMS / program, (("reduce", "verify", str(by_name[cluster]), str(SPECS / "models" / model),
                                                "{spec}"),)))
    return out


# -- mutations ---------------------------------------------------------------------------

# Values of every type and magnitude a spec field might be handed.
WEIRD_VALUES = [
    0, -1, 1, 2, 3, 7, 1000, 10**6, 2**31, 2**63, 2**64, 10**100, 10**400, True, False, None,
    0.0, -0.0, 0.5, 1e-300, 1e300, float("inf"), float("-inf"), float("nan"), "", "x", "auto", "R", "S01",
    "1e999 GB", "0 GB/s", "-5us", "1e-300 s", "1e300 s", "5 parsecs", "8 GiB/s", "100Gbps", "270 GB/s",
    "2 GiB", "5us", "312 TFLOP/s", "1.2 TFLOP", "4 devices", "node", "gpu", "device", "ring", "switch",
    [], [1], [0, 0], [10**100, 4], {}, {"name": "x"}, "9" * 401, "é", "a\tb",
]
UNIT_SUFFIXES = ["", " B", " KiB", " GiB", " GB", " PB", " GB/s", " Gbps", " b/s", " us", " ms", " s", " ns",
                 " TFLOP", " TFLOP/s", " FLOPS", " parsecs", "GiBGiB"]
KEY_NAMES = ["name", "count", "size", "bytes", "weight", "levels", "axes", "layers", "repeat", "hosts",
             "devices_per_host", "first_device", "shape", "spec", "global_batch", "microbatches", "via",
             "sharing", "level", "latency", "bandwidth", "memory", "flops", "colour", "transformer", "training"]


def _paths(node, prefix=()):
    """Every path to a value in the data (dict keys and list indices)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def _get(node, path):
    for part in path:
        node = node[part]
    return node


def _set(root, path, value):
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def _scale(value, rng: random.Random):
    """The same quantity, ten to the power of something else."""
    factor = 10 ** rng.choice([-300, -30, -9, -3, -1, 1, 2, 3, 6, 9, 18, 30, 100, 300])
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        scaled = value * factor
        return int(scaled) if isinstance(value, int) and factor >= 1 else scaled
    if isinstance(value, str):
        match = re.match(r"\s*([0-9.eE+-]+)(.*)", value)
        if match:
            try:
                number = float(match.group(1)) * factor
            except (ValueError, OverflowError):
                return value
            return f"{number:g}{match.group(2)}"
    return value


def _unit(value, rng: random.Random):
    """The same number with another unit (or none)."""
    if isinstance(value, str):
        match = re.match(r"\s*([0-9.eE+-]+)\s*(.*)", value)
        if match:
            return match.group(1) + rng.choice(UNIT_SUFFIXES)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value}{rng.choice(UNIT_SUFFIXES)}"
    return value


def mutate_data(data, rng: random.Random):
    """One change to the parsed spec: a value replaced, scaled or re-united, a key renamed,
    removed or added, a list entry duplicated or dropped."""
    data = copy.deepcopy(data)
    paths = list(_paths(data))
    path = rng.choice(paths)
    value = _get(data, path) if path else data
    kind = rng.randrange(9)
    if kind == 0 or not path:
        return _set(data, path, copy.deepcopy(rng.choice(WEIRD_VALUES))) if path else data
    parent = _get(data, path[:-1])
    last = path[-1]
    if kind == 1:
        return _set(data, path, _scale(value, rng))
    if kind == 2:
        return _set(data, path, _unit(value, rng))
    if kind == 3 and isinstance(parent, dict):
        del parent[last]
        return data
    if kind == 4 and isinstance(parent, dict):
        new = rng.choice(KEY_NAMES + [str(last) + "s", str(last).upper()])
        if new not in parent:
            parent[new] = parent.pop(last)
        return data
    if kind == 5 and isinstance(parent, list):
        parent.insert(last, copy.deepcopy(value))
        return data
    if kind == 6 and isinstance(parent, list):
        del parent[last]
        return data
    if kind == 7 and isinstance(value, dict):
        value[rng.choice(KEY_NAMES)] = copy.deepcopy(rng.choice(WEIRD_VALUES))
        return data
    if kind == 8 and isinstance(value, list) and value:
        return _set(data, path, value * rng.choice([2, 10, 300]))
    return _set(data, path, copy.deepcopy(rng.choice(WEIRD_VALUES)))


def _alias_bomb(depth: int, width: int) -> str:
    lines = ["b0: &b0 [" + ",".join(["x"] * width) + "]"]
    for i in range(1, depth):
        lines.append(f"b{i}: &b{i} [" + ",".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def mutate_text(text: str, rng: random.Random) -> bytes:
    """One change to the file itself: YAML structure, anchors, nesting, bytes."""
    lines = text.splitlines(keepends=True) or ["\n"]
    i = rng.randrange(len(lines))
    kind = rng.randrange(12)
    if kind == 0:                                    # a line dropped
        del lines[i]
    elif kind == 1:                                  # a line doubled (often a duplicate key)
        lines.insert(i, lines[i])
    elif kind == 2:                                  # indentation broken
        lines[i] = " " * rng.choice([1, 3, 8]) + lines[i]
    elif kind == 3:                                  # truncated
        return "".join(lines)[: rng.randrange(len(text) + 1)].encode()
    elif kind == 4:                                  # an alias bomb
        lines.append(_alias_bomb(rng.choice([3, 6, 9]), rng.choice([3, 9])))
    elif kind == 5:                                  # deep nesting in a value
        n = rng.choice([10, 70, 500, 5000])
        lines[i] = re.sub(r": (.*)$", lambda m: ": " + "[" * n + "]" * n, lines[i], count=1)
    elif kind == 6:                                  # a NUL byte
        data = "".join(lines).encode()
        k = rng.randrange(len(data) + 1)
        return data[:k] + b"\x00" + data[k:]
    elif kind == 7:                                  # invalid UTF-8
        data = "".join(lines).encode()
        k = rng.randrange(len(data) + 1)
        return data[:k] + rng.choice([b"\xff", b"\xc3", b"\xe9t\xe9"]) + data[k:]
    elif kind == 8:                                  # a control character or odd YAML
        lines[i] = lines[i].rstrip("\n") + rng.choice(["\x07", " &a", " *a", " !!python/name:os.system", " !!binary x",
                                                       " ? [a]", " <<: *a", " %", " @", " |", " >"]) + "\n"
    elif kind == 9:                                  # an anchor and an alias to it
        lines.append("x0: &x0 " + rng.choice(["[1, 2]", "{a: 1}", "foo"]) + "\n")
        lines.append(rng.choice(["x1: *x0\n", "x1: *missing\n", "x1: &x1 [*x1]\n", "<<: *x0\n"]))
    elif kind == 10:                                 # tabs, CRLF, a BOM
        return rng.choice([b"\xef\xbb\xbf", b""]) + "".join(lines).replace("\n", rng.choice(["\r\n", "\r", "\n\t"])).encode()
    else:                                            # random characters somewhere
        k = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:k] + "".join(rng.choice(":-[]{}&*!|>'\"#%@`,? \n") for _ in range(rng.randrange(1, 4))) + lines[i][k:]
    return "".join(lines).encode()


def mutate(text: str, rng: random.Random) -> bytes:
    """One to three mutations of a spec's text, mostly on its data, sometimes on its bytes."""
    data = yaml.safe_load(text)
    unchanged = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)
    rounds = rng.choice([1, 1, 1, 2, 3])
    for _ in range(rounds):
        if rng.random() < 0.7:
            data = mutate_data(data, rng)
    out = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)
    # a case that changes nothing tests nothing: then the bytes are mutated instead
    if rng.random() < 0.3 or out == unchanged:
        return mutate_text(out, rng)
    return out.encode()


# -- running one case --------------------------------------------------------------------

@dataclass
class Result:
    outcome: str
    code: int | None
    seconds: float
    stderr: str = ""
    args: tuple[str, ...] = field(default_factory=tuple)


def _child(args: list[str], out_fd: int, memory: int) -> None:
    """Run the command as ``solver-planner`` would, in this forked process; never returns."""
    os.dup2(out_fd, 2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
    code = 1
    try:
        # the case's allowance on top of what the fork already maps: a test runner that has
        # imported torch before (xdist gives a worker several files) maps more than 3 GiB
        from solver_planner.memory import address_space

        limit = memory + (address_space() or 0)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        sys.argv = ["solver-planner", *args]
        from solver_planner.cli import main
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except MemoryError:
        sys.stderr.write("\nMemoryError\n")
        code = 137
    except BaseException:  # what an uncaught exception would print
        import traceback
        traceback.print_exc()
        code = 1
    try:
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(code)


def run_case(args: list[str], timeout: float = TIMEOUT, memory: int = MEMORY_LIMIT) -> tuple[int | None, str, float, bool]:
    """Run ``solver-planner ARGS`` in a fork; (exit code or None on timeout, stderr, seconds, out of memory)."""
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        _child(args, write_fd, memory)
    os.close(write_fd)
    chunks: list[bytes] = []
    size = 0
    deadline = start + timeout
    code: int | None = None
    status = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            status = None
            break
        ready, _, _ = select.select([read_fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(read_fd, 65536)
            if chunk:
                if size < 2**20:
                    chunks.append(chunk)
                size += len(chunk)
                continue
            _, status = os.waitpid(pid, 0)  # stderr closed: the child is ending
            break
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
    os.close(read_fd)
    seconds = time.monotonic() - start
    stderr = b"".join(chunks).decode("utf-8", errors="replace")
    if status is not None:
        code = os.waitstatus_to_exitcode(status)
    oom = code == 137 or "MemoryError" in stderr
    return code, stderr, seconds, oom


_LINE = re.compile(r":\d+:")


def judge(args: list[str], spec_file: str, code: int | None, stderr: str, oom: bool) -> str:
    """Sort one run into :data:`OUTCOMES`."""
    if code is None:
        return "hang"
    if oom:
        return "out-of-memory"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if code not in (0, 1, 2, 3):
        return "bad-exit"
    if code == 2:
        head = f"error: {spec_file}"
        for line in stderr.splitlines():
            if line.startswith(head) and not _LINE.match(line[len(head):]):
                return "no-line"
    return "ok"


def fuzz_case(target: Target, command: tuple[str, ...], data: bytes, workdir: Path,
              timeout: float = TIMEOUT) -> Result:
    """Write the mutated spec, run the command on it, judge it."""
    spec = workdir / target.spec.name
    spec.write_bytes(data)
    args = [str(spec) if a == "{spec}" else a for a in command]
    code, stderr, seconds, oom = run_case(args, timeout)
    return Result(judge(args, str(spec), code, stderr, oom), code, seconds, stderr, tuple(args))


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--keep", type=Path, help="write each failing spec into this folder")
    parser.add_argument("--show", type=int, default=10, help="failures printed in full")
    opts = parser.parse_args(argv)

    preload()

    all_targets = targets()
    texts = {t.spec: t.spec.read_text(encoding="utf-8") for t in all_targets}
    counts: Counter[str] = Counter()
    per_command: Counter[tuple[str, str]] = Counter()
    failures: list[tuple[int, Result]] = []
    slowest = 0.0
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(opts.cases):
            rng = random.Random(f"{opts.seed}:{n}")
            target = rng.choice(all_targets)
            command = rng.choice(target.commands)
            data = mutate(texts[target.spec], rng)
            result = fuzz_case(target, command, data, Path(tmp), opts.timeout)
            counts[result.outcome] += 1
            per_command[(command[0] if command[0] != "reduce" else "reduce verify", result.outcome)] += 1
            slowest = max(slowest, result.seconds)
            if result.outcome != "ok":
                failures.append((n, result))
                if opts.keep:
                    opts.keep.mkdir(parents=True, exist_ok=True)
                    (opts.keep / f"case{n}-{target.spec.name}").write_bytes(data)
            if (n + 1) % 500 == 0:
                print(f"{n + 1} cases, {time.monotonic() - start:.0f} s: " +
                      ", ".join(f"{k} {counts[k]}" for k in OUTCOMES), file=sys.stderr, flush=True)
    print(f"{opts.cases} cases (seed {opts.seed}) in {time.monotonic() - start:.0f} s; slowest case {slowest:.1f} s")
    print(f"{'outcome':<16}{'cases':>8}")
    for outcome in OUTCOMES:
        print(f"{outcome:<16}{counts[outcome]:>8}")
    commands = sorted({c for c, _ in per_command})
    print("\nper command: " + ", ".join(f"{c} {sum(v for (k, _), v in per_command.items() if k == c)}" for c in commands))
    for n, result in failures[: opts.show]:
        print(f"\ncase {n}: {result.outcome} (exit {result.code}, {result.seconds:.1f} s): solver-planner {' '.join(result.args)}")
        print(f"  {_last_line(result.stderr)[:300]}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
