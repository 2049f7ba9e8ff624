"""The memory split of the pictures: weights + gradients + optimizer state = the memory model's
static bytes, for every optimizer sharding, tensor degree and layer range."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.stages.memory import SHARDINGS, static_bytes, static_split


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=8), st.lists(st.floats(0, 1e12), min_size=1, max_size=8),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3, 16]), st.sampled_from(SHARDINGS))
def test_split_adds_up_to_static_bytes(params, optimizer, t, d, sharding):
    n = min(len(params), len(optimizer))
    P, O = np.array(params[:n]), np.array(optimizer[:n])
    w, g, o = static_split(P, O, t, d, sharding)
    assert np.allclose(w + g + o, static_bytes(P, O, t, d, sharding), rtol=1e-12, atol=1e-6)
    assert (w >= 0).all() and (g >= 0).all() and (o >= 0).all()


def test_stage_memory_adds_up_to_each_stages_peak():
    from conftest import ROOT
    from solver_planner.plan import make_plan
    from solver_planner.spec import load_cluster_spec, load_model_spec
    from solver_planner.stages.memory import stage_memory
    from solver_planner.topology import Topology

    for model in ("gpt-tiny", "gpt3-2.6b"):
        topo = Topology(load_cluster_spec(ROOT / "specs/clusters/aws-p3.8xlarge-2.yaml"))
        plan = make_plan(topo, load_model_spec(ROOT / f"specs/models/{model}.yaml"))
        split = stage_memory(plan.partition, plan.run.peak_memory)
        assert len(split) == len(plan.parts)
        for parts, peak in zip(split, plan.run.peak_memory):
            assert sum(parts.values()) == __import__("pytest").approx(peak, rel=1e-9)
            assert parts["weights"] > 0 and parts["activations"] > 0
