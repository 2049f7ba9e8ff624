"""Which torch releases run the torch.distributed lowering?  (issue 15)

For every torch version given, in a fresh virtualenv under /tmp (deleted afterwards):

1. install ``torch==VERSION``: from PyTorch's CPU wheel index when it answers, else from
   the default index (on Linux x86_64 that is a CUDA build, some GB with its nvidia-*
   packages; one pip cache serves all the versions of a run, --cache-dir keeps it);
2. install the project without its torch extra (``pip install -e PROJECT``), then the test
   tools (pytest, hypothesis, jsonschema);
3. probe the calls the lowering makes: every torch / torch.distributed name it uses, and
   every collective on 2 gloo processes with CPU tensors of the dtypes it uses;
4. run ``python -m pytest -q tests/test_distributed.py`` and
   ``solver-planner execute reduction specs/clusters/local-2x4.yaml specs/models/local-2x4.yaml --top 3``
   and ``solver-planner execute reshard specs/clusters/local-2x4.yaml specs/models/local-2x4.yaml``;

then prints a table: version, where it came from, install ok, probe, tests passed/failed,
execute ok; the first error of whatever failed below it, and full logs under --logs.

    python benchmarks/torch_versions.py 2.13.0 2.2.0 2.1.2
    python benchmarks/torch_versions.py 2.2.0 --numpy '<2'   # numpy 1.x beside an older torch
    python benchmarks/torch_versions.py --project /tmp/snapshot 2.2.0   # another checkout

A script that prints a table, not a test: it downloads GBs and takes minutes per version.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TEST_TOOLS = ["pytest>=7.4", "hypothesis>=6.90", "jsonschema>=4.18"]  # the test extra, less torch
CLUSTER, MODEL = "specs/clusters/local-2x4.yaml", "specs/models/local-2x4.yaml"
EXECUTES = {
    "reduction": ["execute", "reduction", CLUSTER, MODEL, "--top", "3"],
    "reshard": ["execute", "reshard", CLUSTER, MODEL],
}

# What solver_planner/distributed/ uses of torch (interpreter.py, launch.py, calibrate.py).
DIST_NAMES = ["is_available", "is_gloo_available", "is_nccl_available", "init_process_group", "new_group",
              "destroy_process_group", "barrier", "broadcast", "all_reduce", "reduce", "reduce_scatter_tensor",
              "all_gather_into_tensor", "send", "recv"]
TORCH_NAMES = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "int64", "int32", "int16", "int8",
               "uint8", "bool"]

# Run by the venv's python: names present, then every collective on 2 gloo ranks.  Prints one
# JSON object {what: first line of the error} (empty: everything worked).
PROBE = r'''
import datetime, json, os, sys, tempfile, traceback
import multiprocessing as mp

DIST_NAMES, TORCH_NAMES = %s, %s
DTYPES = ["float32", "float16", "bfloat16", "int64", "float8_e4m3fn"]

def first_line(exc):
    text = str(exc).strip().splitlines()
    return type(exc).__name__ + ": " + (text[0] if text else "")

def worker(rank, world, store, queue):
    out = {}
    try:
        import torch
        import torch.distributed as dist
        for name in TORCH_NAMES:
            if not hasattr(torch, name):
                out["torch." + name] = "missing"
        for name in DIST_NAMES:
            if not hasattr(dist, name):
                out["dist." + name] = "missing"
        try:
            import torch.distributed.run  # noqa: F401 - torchrun, which --emit's module runs under
        except Exception as exc:
            out["torch.distributed.run"] = first_line(exc)
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        group = dist.new_group([0, 1])
        for name in DTYPES:
            dtype = getattr(torch, name, None)
            if dtype is None:
                continue
            def make(n, fill):
                return torch.full((n,), fill, dtype=torch.float32).to(dtype)
            calls = {
                "broadcast": lambda: dist.broadcast(make(4, rank + 1), src=0, group=group),
                "all_reduce": lambda: dist.all_reduce(make(4, rank + 1), group=group),
                "reduce": lambda: dist.reduce(make(4, rank + 1), dst=0, group=group),
                "reduce_scatter_tensor": lambda: getattr(dist, "reduce_scatter_tensor")(
                    make(2, 0), make(4, rank + 1), group=group),
                "all_gather_into_tensor": lambda: getattr(dist, "all_gather_into_tensor")(
                    make(4, 0), make(2, rank + 1), group=group),
                "send/recv": lambda: (dist.send(make(4, 1), 1) if rank == 0 else dist.recv(make(4, 0), 0)),
            }
            for op, call in calls.items():
                if name == "float8_e4m3fn" and op not in ("broadcast", "send/recv"):
                    continue  # the lowering only moves float8 tiles (resharding), never sums them
                try:
                    call()
                except Exception as exc:
                    out[op + "[" + name + "]"] = first_line(exc)
                dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:
        out["probe"] = first_line(exc) + " | " + traceback.format_exc().strip().splitlines()[-1]
    queue.put((rank, out))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(), "store")
    procs = [ctx.Process(target=worker, args=(r, 2, store, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    merged = {}
    for _ in procs:
        rank, out = queue.get(timeout=600)
        for key, value in out.items():
            merged.setdefault(key, value)
    for p in procs:
        p.join(timeout=30)
    print(json.dumps(merged))
''' % (repr(DIST_NAMES), repr(TORCH_NAMES))


@dataclass
class Result:
    version: str
    source: str = "-"
    installed: str = ""  # torch.__version__ as imported
    install_ok: bool = False
    install_s: float = 0.0
    venv_mb: int = 0
    numpy: str = ""
    probe: dict = field(default_factory=dict)
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0
    tests_ran: bool = False
    execute: dict = field(default_factory=dict)  # name -> ok
    errors: list = field(default_factory=list)  # first error of each thing that failed

    @property
    def all_ok(self) -> bool:
        return (self.install_ok and self.tests_ran and self.failed == 0 and self.passed > 0
                and bool(self.execute) and all(self.execute.values()))


def sh(cmd, log: Path, cwd=None, env=None, timeout=3600) -> int:
    """Run ``cmd`` with its output appended to ``log``; the exit code (124 on time-out)."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        try:
            return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[timed out after {timeout} s]\n")
            return 124


def first_error(log: Path, since: int = 0) -> str:
    """The most telling line of a log written from byte ``since`` on."""
    text = log.read_bytes()[since:].decode("utf-8", "replace").splitlines()
    for pattern in (r"^(FAILED|ERROR) ", r"^E\s+\w*(Error|Exception)\b", r"^\w*(Error|Exception)\b.*:", r"^ERROR:",
                    r"rank \d+ failed", r"error", r"timed out"):
        for line in text:
            if re.search(pattern, line, re.IGNORECASE if pattern in ("error", "timed out") else 0):
                return line.strip()[:300]
    return (text[-1].strip() if text else "")[:300]


def cpu_index_answers() -> bool:
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=15) as reply:
            return reply.status == 200
    except Exception:  # noqa: BLE001 - unreachable for whatever reason
        return False


def clean_env(venv: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PIP_CACHE_DIR"] = str(cache)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ of another torch in the work tree
    return env


def check_version(version: str, args, cache: Path, use_cpu_index: bool) -> Result:
    res = Result(version)
    logs = Path(args.logs)
    venv = Path(tempfile.mkdtemp(prefix=f"torch-{version}-", dir=args.tmp))
    env = clean_env(venv, cache)
    py, pip = venv / "bin" / "python", [venv / "bin" / "python", "-m", "pip"]
    install_log = logs / f"{version}-install.log"
    install_log.unlink(missing_ok=True)
    try:
        if sh([args.python, "-m", "venv", venv], install_log, env=env) != 0:
            res.errors.append("venv: " + first_error(install_log))
            return res
        sh([*pip, "install", "-q", "--upgrade", "pip"], install_log, env=env)
        start = time.perf_counter()
        rc = 1
        if use_cpu_index:
            rc = sh([*pip, "install", f"torch=={version}", "--index-url", CPU_INDEX], install_log, env=env)
            res.source = "cpu index"
        if rc != 0:
            rc = sh([*pip, "install", f"torch=={version}"], install_log, env=env)
            res.source = "default index"
        if rc != 0:
            res.errors.append("install torch: " + first_error(install_log))
            return res
        # The project without its torch extra, then the test tools: none may replace torch.
        pin = venv / "torch-pin.txt"
        pin.write_text(f"torch=={version}\n")
        extra = ["-c", pin, *args.also]
        if args.numpy:
            extra.append(f"numpy{args.numpy}")
        if (sh([*pip, "install", "-e", args.project, *extra], install_log, env=env) != 0
                or sh([*pip, "install", *TEST_TOOLS, *extra], install_log, env=env) != 0):
            res.errors.append("install project: " + first_error(install_log))
            return res
        res.install_s = time.perf_counter() - start
        got = subprocess.run([py, "-c", "import numpy, torch; print(torch.__version__, numpy.__version__)"],
                             capture_output=True, text=True, env=env, cwd=venv)
        if got.returncode != 0:
            res.errors.append("import torch: " + (got.stderr.strip().splitlines() or ["?"])[-1])
            return res
        res.installed, res.numpy = got.stdout.split()[-2:]
        res.install_ok = True
        res.venv_mb = int(sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20)

        probe = venv / "probe.py"
        probe.write_text(PROBE)
        got = subprocess.run([py, probe], capture_output=True, text=True, env=env, cwd=venv, timeout=900)
        (logs / f"{version}-probe.log").write_text(got.stdout + got.stderr)
        try:
            res.probe = json.loads(got.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            res.probe = {"probe": "did not finish: " + (got.stderr.strip().splitlines() or ["?"])[-1]}

        if not args.skip_tests:
            log = logs / f"{version}-pytest.log"
            log.unlink(missing_ok=True)
            sh([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests], log, cwd=args.project, env=env,
               timeout=args.timeout)
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
            summary = next((line for line in reversed(tail) if re.search(r"\d+ (passed|failed|error)", line)), "")
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
            res.passed, res.skipped = counts.get("passed", 0), counts.get("skipped", 0)
            res.failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
            res.tests_ran = bool(summary)
            if res.failed or not res.tests_ran:
                res.errors.append("tests: " + first_error(log))
        for name, cli in EXECUTES.items():
            log = logs / f"{version}-execute-{name}.log"
            log.unlink(missing_ok=True)
            rc = sh([venv / "bin" / "solver-planner", *cli], log, cwd=args.project, env=env, timeout=args.timeout)
            res.execute[name] = rc == 0
            if rc != 0:
                res.errors.append(f"execute {name} (exit {rc}): " + first_error(log))
        return res
    finally:
        if args.keep:
            print(f"  kept {venv}", flush=True)
        else:
            shutil.rmtree(venv, ignore_errors=True)


def table(results: list[Result]) -> str:
    head = ["torch", "installed", "from", "numpy", "install", "venv MB", "probe", "tests passed", "failed",
            "execute reduction", "execute reshard", "all ok"]
    rows = []
    for r in results:
        yes = lambda b: "ok" if b else "FAIL"  # noqa: E731
        rows.append([r.version, r.installed or "-", r.source, r.numpy or "-",
                     f"ok {r.install_s:.0f} s" if r.install_ok else "FAIL", str(r.venv_mb or "-"),
                     ("ok" if not r.probe else f"{len(r.probe)} problem(s)") if r.install_ok else "-",
                     str(r.passed) if r.tests_ran else "-", str(r.failed) if r.tests_ran else "-",
                     yes(r.execute.get("reduction")) if r.execute else "-",
                     yes(r.execute.get("reshard")) if r.execute else "-", "YES" if r.all_ok else "no"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    for r in results:
        for what, why in r.probe.items():
            out.append(f"{r.version}: probe {what}: {why}")
        for err in r.errors:
            out.append(f"{r.version}: {err}")
    ok = [r.version for r in results if r.all_ok]
    if ok:
        key = lambda v: tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", v))  # noqa: E731
        out.append(f"lowest version that passed everything: {min(ok, key=key)}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="+", help="torch versions, e.g. 2.13.0 2.2.0 2.1.2")
    parser.add_argument("--project", default=str(ROOT), help="the checkout to install and test (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    parser.add_argument("--tests", nargs="+", default=["tests/test_distributed.py"], help="pytest arguments")
    parser.add_argument("--skip-tests", action="store_true", help="only the probe and the two executes")
    parser.add_argument("--numpy", default="", help="a numpy specifier installed with the project, e.g. '<2'")
    parser.add_argument("--with", dest="also", action="append", default=[], metavar="PACKAGE",
                        help="one more package installed with the project (repeatable), e.g. a dependency the "
                             "project forgot to declare")
    parser.add_argument("--tmp", default="/tmp", help="where the venvs (and the pip cache) go")
    parser.add_argument("--logs", default=None, help="log folder (default: TMP/torch-versions-logs)")
    parser.add_argument("--cache-dir", default=None, help="pip cache to keep between runs (default: a fresh one, "
                                                          "deleted at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the venvs")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the tests, and for each execute")
    args = parser.parse_args(argv)
    args.project = str(Path(args.project).resolve())
    args.logs = args.logs or os.path.join(args.tmp, "torch-versions-logs")
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="torch-versions-pipcache-",
                                                                               dir=args.tmp))
    use_cpu_index = cpu_index_answers()
    print(f"CPU wheel index {'answers' if use_cpu_index else 'does not answer: using the default index'}; "
          f"project {args.project}; logs in {args.logs}", flush=True)
    results = []
    try:
        for version in args.versions:
            start = time.perf_counter()
            print(f"torch {version} ...", flush=True)
            results.append(check_version(version, args, cache, use_cpu_index))
            r = results[-1]
            print(f"torch {version}: {'all ok' if r.all_ok else 'FAILED'} in {time.perf_counter() - start:.0f} s"
                  + "".join(f"\n  {e}" for e in r.errors), flush=True)
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
