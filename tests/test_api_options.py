"""The scripting API refuses what the command line refuses, with the library's error
(README: every error is a PlannerError): a wrong choice, a number out of the command's
range or of the wrong type, a path that is not one (an integer was opened as a file
descriptor: 1 closed the process's stdout)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import CLUSTERS, SPECS
from solver_planner import api as sp
from solver_planner.errors import OptionError, PlannerError

C, M, G = CLUSTERS / "aws-p3.8xlarge-2.yaml", SPECS / "models" / "local-2x4.yaml", SPECS / "models" / "gpt3-2.6b.yaml"
PROGRAM = "AllReduce(root, InsideGroup)"

REFUSED = {
    "load an integer (stdin)": lambda: sp.load(0, M),
    "load a boolean (stdout)": lambda: sp.load(True, M),
    "load None": lambda: sp.load(C, None),
    "place method": lambda: sp.place(C, M, method="x"),
    "place algorithm": lambda: sp.place(C, M, algorithm="rnig"),
    "place size metric": lambda: sp.place(C, M, size_metric="lines"),
    "place max_size text": lambda: sp.place(C, M, max_size="5"),
    "place max_size 0": lambda: sp.place(C, M, max_size=0),
    "place max_size 2.5": lambda: sp.place(C, M, max_size=2.5),
    "place a matrix of other sizes": lambda: sp.place(C, M, matrices=["[[1]]"]),
    "verify empty program": lambda: sp.verify(C, M, ""),
    "verify None program": lambda: sp.verify(C, M, None),
    "verify unparsable program": lambda: sp.verify(C, M, "AllReduce(root"),
    "verify timeout text": lambda: sp.verify(C, M, PROGRAM, timeout="x"),
    "verify timeout 0": lambda: sp.verify(C, M, PROGRAM, timeout=0),
    "verify negative matrix": lambda: sp.verify(C, M, PROGRAM, matrix="[[-1,-2],[2,2]]"),
    "verify boolean matrix": lambda: sp.verify(C, M, PROGRAM, matrix=[[True, 2], [2, 2]]),
    "reshard strategy": lambda: sp.reshard(C, M, strategy="x"),
    "reshard method": lambda: sp.reshard(C, M, method="x"),
    "reshard time_limit text": lambda: sp.reshard(C, M, time_limit="x"),
    "reshard time_limit negative": lambda: sp.reshard(C, M, time_limit=-1),
    "reshard workers 0": lambda: sp.reshard(C, M, workers=0),
    "reshard seed text": lambda: sp.reshard(C, M, seed="x"),
    "reshard a list of numbers": lambda: sp.reshard(C, [1]),
    "stages num_stages text": lambda: sp.stages(C, G, num_stages="2"),
    "stages num_stages 0": lambda: sp.stages(C, G, num_stages=0),
    "stages config 5": lambda: sp.stages(C, G, config=5),
    "stages config with 0": lambda: sp.stages(C, G, config=(0, 1, 8, 1)),
    "stages split 5": lambda: sp.stages(C, G, split=5),
    "stages top text": lambda: sp.stages(C, G, top="x"),
    "stages top 0": lambda: sp.stages(C, G, top=0),
    "stages budget -5": lambda: sp.stages(C, G, budget=-5),
    "stages gap 1": lambda: sp.stages(C, G, gap=1.0),
    "stages compute": lambda: sp.stages(C, G, compute="fast"),
    "plan cross_mesh": lambda: sp.plan(C, G, cross_mesh="x"),
    "plan candidates 0": lambda: sp.plan(C, G, candidates=0),
    "plan budget 0": lambda: sp.plan(C, G, budget=0),
    "plan gap 1": lambda: sp.plan(C, G, gap=1.0),
    "plan simulations text": lambda: sp.plan(C, G, simulations="x"),
    "plan meshes": lambda: sp.plan(C, G, meshes="uneven"),
    "check None": lambda: sp.check(C, G, None),
}


@pytest.mark.parametrize("call", REFUSED.values(), ids=REFUSED.keys())
def test_a_wrong_argument_is_an_option_error(call):
    with pytest.raises(OptionError):
        call()
    # the process's stdout, fd 1, still open (sp.load(True, ...) once closed it); under
    # pytest's capture sys.stdout is not fd 1, so ask the file descriptor itself
    os.fstat(1)


def test_the_unknown_choice_suggests_the_near_one():
    with pytest.raises(PlannerError, match="did you mean 'ring'"):
        sp.place(C, M, algorithm="rnig")


def test_numpy_numbers_are_numbers_and_leave_as_python_ones():
    """Accepted, and converted: an np.int64 once reached the plan document, which JSON and
    YAML then could not write."""
    import json

    report = sp.stages(C, G, config=(np.int64(2), 1, 4, 512), top=np.int64(1), time_limit=np.float64(10),
                       num_stages=np.int64(4), devices=np.int64(8))
    assert report.result.status.value == "OPTIMAL"
    json.dumps(report.as_dict())
    assert all(type(n) is int for n in sp._split([np.int64(9), 8])) and type(sp._config((np.int64(2), 1, 4, 8)).data) is int
    with pytest.raises(OptionError, match="nan is not in"):
        sp.stages(C, G, time_limit=float("nan"))
    assert len(sp.reshard(C, M, seed=-5)) == 4             # `--seed` takes any integer
    with pytest.raises(OptionError, match="instructions"):
        sp.verify(C, M, [1, 2])
