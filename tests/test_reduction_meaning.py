"""One meaning of a reduction program (reduction/layout.py), four implementations that must agree.

The rules with damage tracking (verify.check_program), the z3 proof over symbolic data
(proof.prove), the numpy executor (execute.execute) and, in test_distributed.py, real
gloo processes.  Random programs come from reduction/generate.py: hierarchical recipes
with unsorted groups, mutated so that about half are invalid.
"""

import copy
import dataclasses
import random

import pytest
from hypothesis import given, settings, strategies as st

from solver_planner.cost import Collective, CostModel
from solver_planner.distributed.lower import lower_reduction
from solver_planner.errors import LoweringError
from solver_planner.placement import ParallelismMatrix
from solver_planner.reduction import Lowering, SynthesisHierarchy, parse_program
from solver_planner.reduction.execute import execute
from solver_planner.reduction.generate import random_program
from solver_planner.reduction.layout import Atoms, buffers, chunks_of, contiguous, copies, trace
from solver_planner.reduction.proof import prove, verify_z3
from solver_planner.reduction.ranking import cost_program, replay
from solver_planner.reduction.semantics import Semantics, Violation
from solver_planner.reduction.synthesis import candidates, lower_program, program_size, synthesize
from solver_planner.reduction.verify import check_program, system_steps, verify_steps

AR, RS, AG, RED, BC = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.REDUCE,
                       Collective.BROADCAST)
ALL8 = [list(range(8))]

# The program of issue 12: device 4 keeps the last block of the second host's scatter.
UNSORTED = [(RS, [[0, 1, 2, 3], [5, 6, 7, 4]]), (AG, [[0, 1, 2, 3], [4, 5, 6, 7]]),
            (AR, [[0, 4], [1, 5], [2, 6], [3, 7]])]


def verdicts(n, k, steps, groups):
    """(rules, z3, numpy): each True when it finds the program valid."""
    return (check_program(n, k, steps, groups).valid, prove(n, k, steps, groups).status == "valid",
            execute(n, k, steps, groups).ok)


def test_the_issue_program_is_valid_everywhere_and_its_torch_lowering_reorders_explicitly():
    assert verdicts(8, 8, UNSORTED, ALL8) == (True, True, True)
    plan = lower_reduction(UNSORTED, 8, 8, ALL8, 3)
    # torch orders the group's ranks ascending: device 4 (written last) must receive the last
    # block, so the scatter input is re-laid out and the gather output put back in place.
    assert [s.copies for s in plan.steps] == [(4, 5, 6, 7), (4, 5, 6, 7), ()]
    rank4 = [c for c in plan.calls[4]]
    assert rank4[0].send == (6, 7, 0, 1, 2, 3, 4, 5) and rank4[0].recv == (6, 7)
    assert rank4[1].recv == (6, 7, 0, 1, 2, 3, 4, 5)


def test_pairing_the_wrong_blocks_is_invalid_with_step_group_device_and_chunk():
    # Device 4 keeps block 3 (chunks 6-7) but is paired with device 0, which keeps block 0.
    steps = [(RS, [[0, 1, 2, 3], [5, 6, 7, 4]]), (AR, [[0, 4], [1, 5], [2, 6], [3, 7]]),
             (AG, [[0, 1, 2, 3], [4, 5, 6, 7]])]
    assert verdicts(8, 8, steps, ALL8) == (False, False, False)
    out = check_program(8, 8, steps, ALL8)
    v = out.cause
    assert (v.step, v.rule, v.group, v.device, v.chunk, v.other) == (1, "R-AllReduce", (0, 4), 4, 0, 0)
    assert "different chunks" in v.message
    assert out.failure is not None and out.failure.rule == "post-condition"
    with_z3 = verify_z3(Lowering(ParallelismMatrix.of([[2, 4]]), (2, 4), ("host", "proc"), [0]), steps)
    assert with_z3.status == "invalid" and with_z3.violation == v


def test_a_program_that_breaks_a_rule_but_discards_the_damage_is_valid_with_a_warning():
    # Step 3 counts device 0..3's sum twice on devices 1 and 3; the broadcast from device 0,
    # which is clean, overwrites both.  Fig. 8 rejects step 3; the sums are exact.
    steps = [(AR, [[0, 1], [2, 3]]), (AR, [[0, 2], [1, 3]]), (AR, [[1, 3]]), (BC, [[0, 1, 2, 3]])]
    groups = [[0, 1, 2, 3]]
    assert verdicts(4, 4, steps, groups) == (True, True, True)
    low = Lowering(ParallelismMatrix.of([[4]]), (4,), ("gpu",), [0])
    verdict = verify_steps(low, steps)
    assert verdict.valid and [w.step for w in verdict.warnings] == [2]
    assert "counts it twice" in verdict.warnings[0].message


def test_a_broadcast_where_nobody_holds_anything_is_a_no_op():
    # After the reduce to device 0, the groups [1, 2] and [3] hold nothing.
    steps = [(RED, [[0, 1, 2, 3]]), (BC, [[0, 3], [1, 2]]), (BC, [[0, 1], [3, 2]])]
    assert verdicts(4, 4, steps, [[0, 1, 2, 3]]) == (True, True, True)
    assert check_program(4, 4, steps, [[0, 1, 2, 3]]).fig8 is None
    sem = Semantics(4, 4)
    reduced = sem.apply(sem.initial(range(4)), RED, [[0, 1, 2, 3]])
    assert not isinstance(sem.apply(reduced, BC, [[0, 3], [1, 2]]), Violation)
    strict = Semantics(4, 4, strict_broadcast=True)
    v = strict.apply(reduced, BC, [[0, 3], [1, 2]], step=1)
    assert isinstance(v, Violation) and "no information" in v.message


@pytest.mark.parametrize("seed", [0] + [pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3)])
def test_rules_z3_and_numpy_agree_on_random_programs(seed):
    rng = random.Random(seed)
    seen = {True: 0, False: 0}
    for _ in range(120):
        p = random_program(rng, 4, 24)
        rules, proved, ran = verdicts(p.num_devices, p.chunks, p.steps, p.reduction_groups)
        assert rules == proved == ran, (p, rules, proved, ran)
        # A call the library cannot run: the layout and the executor find it independently.
        refused = trace(p.num_devices, p.chunks, p.steps).problem
        executed = execute(p.num_devices, p.chunks, p.steps, p.reduction_groups)
        assert (refused is not None) == executed.ill_formed, (p, refused, executed.message)
        if refused is not None:
            assert executed.step == refused.step
        seen[rules] += 1
    assert seen[True] > 20 and seen[False] > 20


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fig8_rules_on_atoms_match_the_bit_matrix_rules(seed):
    """Fig. 8 on runs of chunks (verify.py) against Fig. 8 on whole k x m matrices (semantics.py)."""
    p = random_program(random.Random(seed), 2, 12)
    n, k = p.num_devices, p.chunks
    sem = Semantics(k, n)
    goal = sem.goal_bits([next(g for g in p.reduction_groups if d in g) for d in range(n)])
    _, violation = sem.run(sem.initial(range(n)), p.steps, goal)
    out = check_program(n, k, p.steps, p.reduction_groups)
    accepted = out.valid and out.fig8 is None
    assert accepted == (violation is None), (p, violation, out.cause, out.fig8)
    if violation is not None and violation.rule != "post-condition":
        first = out.fig8 if out.fig8 is not None else out.cause
        assert (first.step, first.group) == (violation.step, violation.group)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_copies_and_atoms_agree_with_chunk_lists(seed):
    p = random_program(random.Random(seed), 2, 16)
    tr = trace(p.num_devices, p.chunks, p.steps)
    atoms = Atoms(tr)
    for step in tr.calls:
        for call in step:
            flags, bufs = copies(call), buffers(call)
            for d, (send, recv) in bufs.items():
                assert flags[d].pack == (not contiguous(send)) and flags[d].unpack == (not contiguous(recv))
            # A stretch is aligned exactly when every member hands the same chunk at each of its positions.
            if call.kind in (AR, RS, RED):
                lists = [chunks_of(r) for r in call.before]
                ends = [pos for pos, _, _ in atoms.segments(call)][1:] + [len(lists[0])]
                for (pos, where, aligned), end in zip(atoms.segments(call), ends):
                    same = [len({lst[i] for lst in lists}) == 1 for i in range(pos, end)]
                    assert all(same) if aligned else not any(same)
                    assert aligned == (len(set(where)) == 1 and all(same))


def test_synthesized_programs_are_valid_for_every_checker_and_lowered_groups_are_ascending():
    for matrix, levels, names, axes in [([[2, 4]], (2, 4), ("node", "gpu"), [0]),
                                        ([[2, 1], [1, 4]], (2, 4), ("node", "gpu"), [1]),
                                        ([[2, 1, 2], [1, 2, 1]], (2, 2, 2), ("node", "cpu", "gpu"), [0])]:
        low = Lowering(ParallelismMatrix.of(matrix), levels, names, axes)
        for cand in candidates(low.hierarchy):
            assert all(list(g) == sorted(g) for g in low.lower(cand.groups))
        for program in synthesize(low.hierarchy, 4):
            steps = system_steps(low, program)
            assert verdicts(low.num_devices, low.hierarchy.size, steps, low.reduction_groups()) == (True, True, True)


def test_the_paper_counts_3_and_47_and_what_the_instruction_count_adds():
    for counts in [(1, 2), (1, 4), (1, 8), (1, 16)]:
        h = SynthesisHierarchy(("root", "node"), counts)
        assert len(synthesize(h, 5, "paper")) == 3 and len(synthesize(h)) == 3
    for counts in [(1, 2, 8), (1, 4, 4), (1, 2, 16), (1, 8, 8), (1, 4, 2)]:
        h = SynthesisHierarchy(("root", "node", "gpu"), counts)
        paper, full = synthesize(h, 5, "paper"), synthesize(h)
        assert len(paper) == 47, counts
        # Every program of the paper's space is in ours; ours adds broadcasts in which some
        # groups hold nothing (R-Broadcast verbatim rejects them) and longer programs.
        assert set(paper) <= set(full) and len(full) == 142
        strict = Semantics(h.size, h.size, strict_broadcast=True)
        for program in set(full) - set(paper):
            if program_size(program, "paper") <= 5:
                state = strict.initial(range(h.size))
                rejected = False
                for kind, groups in lower_program(h, program):
                    nxt = strict.apply(state, kind, groups)
                    if isinstance(nxt, Violation):
                        rejected = kind is BC and "no information" in nxt.message
                        break
                    state = nxt
                assert rejected, program


def test_groups_that_hold_nothing_cost_nothing(a100):
    cost = CostModel(a100)
    low = Lowering(ParallelismMatrix.of([[2, 16]]), (2, 16), ("node", "gpu"), [0])
    parallel = cost_program(cost, low, parse_program(
        "Reduce(node, InsideGroup); AllReduce(node, Parallel(root)); Broadcast(node, InsideGroup)"), 1e9)
    master = cost_program(cost, low, parse_program(
        "Reduce(node, InsideGroup); AllReduce(node, Master(root)); Broadcast(node, InsideGroup)"), 1e9)
    # After the reduce only the roots hold data: 15 of the 16 Parallel groups issue no call.
    assert len(parallel.steps[1].groups) == 1
    assert parallel.time == pytest.approx(master.time, rel=1e-12)
    # The step costs what the one group that moves data costs alone, independently computed.
    alone = cost.collective("allreduce", [[0, 16]], 1e9).time
    assert parallel.step_times[1] == pytest.approx(alone, rel=1e-12)
    replay(cost, parallel)


def test_local_copies_are_priced_at_memory_bandwidth_and_replayed(a100):
    cost = CostModel(a100)
    assert a100.device.memory_bandwidth, "the shipped A100 spec gives its memory bandwidth"
    low = Lowering(ParallelismMatrix.of([[2, 16]]), (2, 16), ("node", "gpu"), [0])
    # Scatter over the whole group, gather across nodes, then inside: the pieces of the
    # gathers are not one run in rank order, so they unpack.
    program = parse_program("ReduceScatter(root, InsideGroup); AllGather(node, Parallel(root)); "
                            "AllGather(node, InsideGroup)")
    priced = cost_program(cost, low, program, 1e9)
    assert [s.copy_time > 0 for s in priced.steps] == [False, True, True]
    unpriced = cost_program(CostModel(without_memory_bandwidth(a100)), low, program, 1e9)
    assert [s.copy_time for s in unpriced.steps] == [0.0, 0.0, 0.0]
    extra = sum(s.copy_time for s in priced.steps)
    assert priced.time == pytest.approx(unpriced.time + extra, rel=1e-12)
    # In the last gather each device packs its 2 chunks (16 apart) and unpacks all 32, of
    # 1e9/32 bytes each, every byte read and written once.
    assert priced.steps[2].copy_time == pytest.approx(2 * 34 * 1e9 / 32 / a100.device.memory_bandwidth, rel=1e-12)
    assert replay(cost, priced).run().makespan == pytest.approx(priced.time, rel=1e-12)


def without_memory_bandwidth(topology):
    """The same topology with a device that gives no memory bandwidth."""
    t = copy.copy(topology)
    t.device = dataclasses.replace(topology.device, memory_bandwidth=None)
    return t


def test_lowering_refuses_what_the_library_cannot_run():
    with pytest.raises(LoweringError, match="both hold chunk"):
        lower_reduction([(AG, [[0, 1]])], 2, 2, [[0, 1]], 1)
    with pytest.raises(LoweringError, match="different sizes"):
        lower_reduction([(RS, [[0, 1]]), (AR, [[0, 2]])], 4, 4, [[0, 1, 2, 3]], 1)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1), st.integers(0, 16), st.integers(0, 16))
def test_run_helpers_agree_with_sets_of_chunks(a, b, p, q):
    from solver_planner.reduction.layout import first_difference, merge, runs_of_mask, size, take
    x, y = runs_of_mask(a), runs_of_mask(b)
    assert chunks_of(x) == [c for c in range(16) if a >> c & 1] and size(x) == bin(a).count("1")
    if a != b:
        assert first_difference(x, y) == min(set(chunks_of(x)) ^ set(chunks_of(y)))
    if not a & b:
        assert merge([x, y]) == runs_of_mask(a | b)
    assert chunks_of(take(x, p, q)) == chunks_of(x)[p:q]


def test_the_lowering_predicts_what_the_ranking_costs(a100):
    """Two implementations of a step's cost (the ranking's, from the synthesis states, and the
    torch lowering's, from the layout's buffers) agree on every synthesized program,
    local copies included."""
    cost = CostModel(a100)
    low = Lowering(ParallelismMatrix.of([[2, 16]]), (2, 16), ("node", "gpu"), [0])
    k, chunk_elems = low.hierarchy.size, 1 << 20
    nbytes = k * chunk_elems * 4
    copying = 0
    for program in synthesize(low.hierarchy, 4):
        ranked = cost_program(cost, low, program, nbytes)
        plan = lower_reduction(system_steps(low, program), low.num_devices, k, low.reduction_groups(), chunk_elems,
                               cost)
        assert [s.predicted for s in plan.steps] == pytest.approx(ranked.step_times, rel=1e-12), program
        copying += any(s.copies for s in plan.steps)
    assert copying > 0, "some programs need local copies"
