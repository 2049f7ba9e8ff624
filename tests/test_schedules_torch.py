"""Our zero-bubble and interleaved schedules are PyTorch's, step for step.

``torch.distributed.pipelining``'s schedule classes compute each rank's action list in
``_calculate_single_rank_operations`` from the stage count, the chunks per rank and the
micro-batches alone.  Building a real schedule needs one process per rank, so the test
gives a bare instance of the class those numbers and asks it for the lists; the ``None``
entries torch pads its lists with (idle steps) are dropped, since only the order of work is
compared.
"""

import pytest

torch_sched = pytest.importorskip("torch.distributed.pipelining.schedules")

from solver_planner.stages.schedule import Schedule, mesh_order, rounds  # noqa: E402

OPS = {"F": "F", "B": "B", "I": "BA", "W": "BW"}


def _torch_lists(cls, S: int, B: int, v: int) -> list[list[tuple[str, int, int]]]:
    sched = cls.__new__(cls)
    sched.pp_group_size = S
    sched._n_microbatches = B
    sched.n_local_stages = v
    sched.num_stages = S * v
    sched._num_stages = S * v
    n = max(1, B // S)
    sched.number_of_rounds = n
    sched.microbatches_per_round = B // n
    out = []
    for rank in range(S):
        acts = [a for a in sched._calculate_single_rank_operations(rank) if a is not None]
        out.append([(OPS[a.computation_type.value], a.stage_index, a.microbatch_index) for a in acts])
    return out


CASES = [(S, B) for S in (1, 2, 3, 4, 5) for B in (1, 2, 3, 4, 6, 8, 9, 12, 16)]


@pytest.mark.parametrize("S,B", CASES)
def test_zb_h1_is_torchs_zero_bubble_with_one_stage_per_rank(S, B):
    theirs = _torch_lists(torch_sched.ScheduleInterleavedZeroBubble, S, B, 1)
    ours = [mesh_order(Schedule("zb-h1"), S, p, B) for p in range(S)]
    assert ours == theirs


@pytest.mark.parametrize("S,B", CASES)
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_1f1b_is_torchs(S, B, v):
    if S < 2 or rounds(S, B) is None:
        pytest.skip("torch refuses these micro-batch counts too")
    theirs = _torch_lists(torch_sched.ScheduleInterleaved1F1B, S, B, v)
    ours = [mesh_order(Schedule("interleaved-1f1b", virtual=v), S, p, B) for p in range(S)]
    assert ours == theirs


@pytest.mark.parametrize("S,B", CASES)
def test_zb_v_is_torchs(S, B):
    theirs = _torch_lists(torch_sched.ScheduleZBVZeroBubble, S, B, 2)
    ours = [mesh_order(Schedule("zb-v", virtual=2), S, p, B) for p in range(S)]
    assert ours == theirs


@pytest.mark.parametrize("kind,v", [("zb-h1", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zb-v", 2)])
@pytest.mark.parametrize("S,B", [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_every_op_once_and_in_dependency_order_per_chunk(kind, v, S, B):
    """Each chunk runs F, then its backward (B, or BA then BW) of every micro-batch exactly
    once, backwards in micro-batch order."""
    s = Schedule(kind, virtual=v)
    seen = {}
    for p in range(S):
        for op, k, m in mesh_order(s, S, p, B):
            seen.setdefault(k, []).append((op, m))
    assert sorted(seen) == list(range(S * v))
    for k, ops in seen.items():
        want = {"F", "B"} if kind == "interleaved-1f1b" else {"F", "BA", "BW"}
        for op in want:
            assert sorted(m for o, m in ops if o == op) == list(range(B))
        pos = {(o, m): i for i, (o, m) in enumerate(ops)}
        for m in range(B):
            back = "B" if "B" in want else "BA"
            assert pos["F", m] < pos[back, m]
            if "BW" in want:
                assert pos["BA", m] < pos["BW", m]
        backs = [m for o, m in ops if o in ("B", "BA")]
        assert backs == sorted(backs)
