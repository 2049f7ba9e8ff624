"""Large hierarchies without per-position state: each fast implementation against the
per-position one it replaces, on random small hierarchies and placements."""

from math import prod

from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.placement import ParallelismMatrix, enumerate_matrices
from solver_planner.reduction.hierarchy import Lowering, SynthesisHierarchy


def groups_by_position(h: SynthesisHierarchy, slice_level, form):
    """P² Table 2 position by position: the definition the range-built groups follow."""
    i = h.index(slice_level)
    if form.kind == "InsideGroup":
        key = lambda c: c[: i + 1]  # noqa: E731
    else:
        j = h.index(form.level)
        key = lambda c: c[: j + 1] + c[i + 1:]  # noqa: E731
    groups = {}
    for p in range(h.size):
        c = h.coords(p)
        if form.kind == "Master" and any(c[i + 1:]):
            continue
        groups.setdefault(key(c), []).append(p)
    return [tuple(g) for g in groups.values()]


@st.composite
def placements(draw, max_devices=48):
    counts = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3))
    n = prod(counts)
    if n > max_devices:
        counts = counts[:1]
        n = counts[0]
    sizes, rest = [], n
    for _ in range(draw(st.integers(0, 2))):
        size = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        sizes.append(size)
        rest //= size
    sizes.append(rest)
    matrix = draw(st.sampled_from(enumerate_matrices(sizes, counts)))
    axes = draw(st.lists(st.integers(0, len(sizes) - 1), min_size=1, unique=True))
    return matrix, counts, [f"l{j}" for j in range(len(counts))], sorted(axes)


@settings(max_examples=150, deadline=None)
@given(placements())
def test_groups_and_lowering_equal_the_per_position_definitions(case):
    matrix, counts, names, axes = case
    low = Lowering(matrix, counts, names, axes)
    h = low.hierarchy
    for slice_level, form in h.instructions():
        assert h.groups(slice_level, form) == groups_by_position(h, slice_level, form)
    # Lowering by the definition: a device's position collapses its reduction digits level
    # by level (axis order, first most significant), its key is its other digits.
    others = [i for i in range(matrix.num_axes) if i not in axes]
    table, keys = {}, set()
    for d in range(prod(counts)):
        digits = matrix.digits(counts, d)
        pos = 0
        for j in range(matrix.num_levels):
            r = 0
            for i in axes:
                r = r * matrix.rows[i][j] + digits[i][j]
            pos = pos * h.counts[j + 1] + r
        key = tuple(digits[i][j] for i in others for j in range(matrix.num_levels))
        table[key, pos] = d
        keys.add(key)
    assert low.keys == sorted(keys)
    assert all(low.device(k, p) == table[k, p] for k, p in table)
    inside = h.groups(h.names[-1], h.instructions()[0][1])
    assert low.lower(inside) == [[table[k, p] for p in g] for k in sorted(keys) for g in inside]
    assert sorted(d for g in low.reduction_groups() for d in g) == list(range(prod(counts)))


def test_a_hundred_thousand_positions_cost_no_per_position_loop():
    low = Lowering(ParallelismMatrix.of([[12500, 8]]), (12500, 8), ("node", "gpu"), [0])
    h = low.hierarchy
    across = h.groups("node", h.instructions()[2][1])   # Parallel(root) at node: one per GPU index
    assert len(across) == 8 and across[3][:3] == (3, 11, 19) and len(across[3]) == 12500
    assert low.lower(across[:1])[0][-1] == 99992


def cluster(counts, sharing, overlap=1.0):
    """A cluster of ``counts`` levels: a switch per level, ports per device or per outer
    instance, a memory bandwidth so that local copies are priced."""
    from solver_planner.spec import load_cluster_spec
    from solver_planner.topology import Topology

    names = [f"l{j}" for j in range(len(counts))]
    lines = ["name: random", "levels:"] + [f"  - {{name: {n}, count: {c}}}" for n, c in zip(names, counts)]
    lines += ["device: {name: gpu, flops: 100 TFLOP/s, memory: 80 GiB, memory_bandwidth: 2 TB/s}",
              f"collective_overlap: {overlap}", "interconnects:"]
    for j, n in enumerate(names):
        share = "device" if sharing[j] or j == 0 else names[j - 1]
        lines.append(f"  - {{name: ic{j}, level: {n}, bandwidth: {10 * (j + 1)} GB/s, latency: {5 - j}us,"
                     f" sharing: {share}}}")
    return Topology(load_cluster_spec("<random>", "\n".join(lines) + "\n"))


def costed_by_position(cost, low, nbytes, metric, algorithm):
    from solver_planner.reduction.ranking import StepCoster
    from solver_planner.reduction.synthesis import synthesize_traced

    coster = StepCoster(cost, low, nbytes, algorithm)
    return [coster.program(p.program, p.held) for p in synthesize_traced(low.hierarchy, 5, metric)]


def costed_by_representative(cost, low, nbytes, metric, algorithm):
    from solver_planner.reduction.symmetry import RepresentativeCoster, representative
    from solver_planner.reduction.synthesis import synthesize_traced

    coster = RepresentativeCoster(cost, low, nbytes, algorithm)
    return coster.programs([p.program for p in synthesize_traced(representative(low.hierarchy), 5, metric)])


def summary(costed):
    return [(c.text, c.time, c.step_times, [(s.collective, s.groups, s.nbytes, s.copy_time) for s in c.steps])
            for c in costed]


@settings(max_examples=40, deadline=None)
@given(placements(max_devices=36), st.lists(st.booleans(), min_size=3, max_size=3), st.sampled_from(["instructions", "paper"]),
       st.sampled_from(["ring", "tree"]), st.sampled_from([1.0, 0.5]))
def test_the_representative_finds_and_costs_what_the_positions_do(case, sharing, metric, algorithm, overlap):
    """Programs in the same order; every program, step by step, the same groups, bytes,
    local copies and times (the per-position semantics on the real hierarchy is the reference)."""
    from solver_planner.cost import CostModel

    matrix, counts, names, axes = case
    cost = CostModel(cluster(counts, sharing, overlap))
    low = Lowering(matrix, counts, names, axes)
    assert summary(costed_by_representative(cost, low, 1e8, metric, algorithm)) == \
        summary(costed_by_position(cost, low, 1e8, metric, algorithm))


@settings(max_examples=60, deadline=None)
@given(placements(max_devices=36), st.randoms(use_true_random=False))
def test_shared_shapes_hold_what_the_layout_says(case, rng):
    """held.py against layout.trace, step by step on synthesized programs: every position's
    runs, and every call's local copies."""
    from solver_planner.reduction import held
    from solver_planner.reduction.layout import copies, trace
    from solver_planner.reduction.synthesis import lower_program, synthesize

    matrix, counts, names, axes = case
    h = Lowering(matrix, counts, names, axes).hierarchy
    programs = synthesize(h, 4)
    for program in rng.sample(programs, min(len(programs), 12)):
        steps = lower_program(h, program)
        shapes = held.Shapes()
        state = held.initial(shapes, h.size, h.size)
        for s, (kind, groups) in enumerate(steps):
            tr = trace(h.size, h.size, steps[:s])
            assert [state.runs(shapes, p) for p in range(h.size)] == tr.final
            after = trace(h.size, h.size, steps[:s + 1])
            for call in after.calls[s]:
                want = max((c.chunks for c in copies(call).values()), default=0)
                assert held.copied_chunks(shapes, state, kind, call.group) == want
            state = held.apply(shapes, state, kind, held.group_array(groups))
        assert [state.runs(shapes, p) for p in range(h.size)] == trace(h.size, h.size, steps).final


TWO_REDUCTIONS = """\
name: random
parallelism:
  axes:
    - {{name: a, size: {a}}}
    - {{name: b, size: {b}}}
reductions:
  - {{name: ra, axes: [a], bytes: 1 GiB}}
  - {{name: rab, axes: [a, b], bytes: 64 MiB, weight: 3}}
"""


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(2, 4), (2, 6), (3, 4), (4, 3), (2, 2, 3)]), st.lists(st.booleans(), min_size=3, max_size=3),
       st.integers(0, 99))
def test_rankings_equal_the_per_position_ones(counts, sharing, pick):
    """rank_placements with the representative (the default where it is smaller) against the
    same ranking forced through the per-position semantics: placements in the same order
    with the same costs, every reduction's programs in the same order with the same times."""
    from unittest import mock

    from solver_planner.reduction import symmetry
    from solver_planner.reduction.ranking import rank_placements
    from solver_planner.spec import load_model_spec

    topo = cluster(list(counts), sharing)
    n = prod(counts)
    a = [d for d in range(2, n) if n % d == 0][pick % len([d for d in range(2, n) if n % d == 0])]
    model = load_model_spec("<m>", TWO_REDUCTIONS.format(a=a, b=n // a))
    fast, _ = rank_placements(topo, model)
    with mock.patch.object(symmetry, "representative", lambda h: h):   # never smaller: per position
        slow, _ = rank_placements(topo, model)

    def ranking(reports):
        return [(str(r.matrix), r.cost, [(red.name, [(p.text, p.time) for p in red.programs]) for red in r.reductions])
                for r in reports]

    assert ranking(fast) == ranking(slow)


@settings(max_examples=25, deadline=None)
@given(placements(max_devices=24), st.randoms(use_true_random=False))
def test_programs_found_on_the_representative_are_proved_valid_on_the_real_system(case, rng):
    """Verdicts on the real devices (z3 and the rules) for what the representative synthesizes,
    and for one-step mutations of them a verdict that the per-position semantics confirms."""
    from solver_planner.cost import Collective
    from solver_planner.reduction.dsl import Instruction
    from solver_planner.reduction.proof import verify_z3
    from solver_planner.reduction.symmetry import representative
    from solver_planner.reduction.synthesis import run_on_hierarchy, synthesize
    from solver_planner.reduction.verify import system_steps, verify_steps

    matrix, counts, names, axes = case
    low = Lowering(matrix, counts, names, axes)
    programs = synthesize(representative(low.hierarchy), 4)
    for program in rng.sample(programs, min(len(programs), 6)):
        steps = system_steps(low, program)
        assert verify_z3(low, steps).valid and verify_steps(low, steps).valid
        i = rng.randrange(len(program))
        mutated = program[:i] + (Instruction(program[i].slice, program[i].form,
                                             rng.choice([c for c in Collective if c is not program[i].collective])),) \
            + program[i + 1:]
        verdict = verify_z3(low, system_steps(low, mutated))
        _, violation = run_on_hierarchy(low.hierarchy, mutated)
        if violation is None:      # Fig. 8 accepts it: then it is valid (the rules are sufficient)
            assert verdict.valid
