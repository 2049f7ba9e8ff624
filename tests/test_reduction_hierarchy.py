"""Synthesis hierarchies (P² Table 1), DSL groups (Table 2) and lowering."""

import pytest

from solver_planner.placement import ParallelismMatrix, enumerate_matrices
from solver_planner.reduction import Form, Lowering, SynthesisHierarchy
from solver_planner.reduction.dsl import format_program, parse_program

# Table 2 uses the system hierarchy of Fig. 2a as the hierarchy.
FIG2A = SynthesisHierarchy(("rack", "server", "CPU", "GPU"), (1, 2, 2, 4))


def names(groups):
    return [["ABCD"[p // 4] + str(p % 4) for p in g] for g in groups]


def G(text):
    """'A0 B0, A1 B1' -> [['A0', 'B0'], ['A1', 'B1']]"""
    return [g.split() for g in text.split(",")]


TABLE2 = [
    ("CPU", Form("InsideGroup"), G("A0 A1 A2 A3, B0 B1 B2 B3, C0 C1 C2 C3, D0 D1 D2 D3")),
    ("CPU", Form("Parallel", "server"), G("A0 B0, A1 B1, A2 B2, A3 B3, C0 D0, C1 D1, C2 D2, C3 D3")),
    ("CPU", Form("Parallel", "rack"), G("A0 B0 C0 D0, A1 B1 C1 D1, A2 B2 C2 D2, A3 B3 C3 D3")),
    ("CPU", Form("Master", "rack"), G("A0 B0 C0 D0")),
    ("server", Form("InsideGroup"), G("A0 A1 A2 A3 B0 B1 B2 B3, C0 C1 C2 C3 D0 D1 D2 D3")),
    ("server", Form("Parallel", "rack"), G("A0 C0, A1 C1, A2 C2, A3 C3, B0 D0, B1 D1, B2 D2, B3 D3")),
    ("rack", Form("InsideGroup"), G("A0 A1 A2 A3 B0 B1 B2 B3 C0 C1 C2 C3 D0 D1 D2 D3")),
]


@pytest.mark.parametrize("slice_level, form, expected", TABLE2, ids=[f"{s}-{f}" for s, f, _ in TABLE2])
def test_table2_row_by_row(slice_level, form, expected):
    assert sorted(names(FIG2A.groups(slice_level, form))) == sorted(expected)


def test_form_must_name_an_ancestor():
    with pytest.raises(ValueError, match="above the slice"):
        FIG2A.groups("server", Form("Parallel", "CPU"))
    with pytest.raises(ValueError, match="no level"):
        FIG2A.groups("socket", Form("InsideGroup"))


def test_table1_reduction_axis_hierarchy():
    m = ParallelismMatrix.of([[1, 1, 2, 2], [1, 2, 1, 2]])
    sh = SynthesisHierarchy.of(m, ("rack", "server", "CPU", "GPU"), [1])
    assert sh.counts == (1, 1, 2, 1, 2)  # root, then the reduction axis row [1 2 1 2]
    # Two reduction axes are collapsed per hardware level: [7 16 27] (Table 1).
    m3 = ParallelismMatrix.of([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert SynthesisHierarchy.of(m3, ("a", "b", "c"), [0, 2]).counts == (1, 7, 16, 27)


def test_lowering_repeats_the_pattern_over_non_reduction_axes():
    for m in enumerate_matrices([4, 2, 4], [2, 4, 4]):
        low = Lowering(m, (2, 4, 4), ("node", "cpu", "gpu"), [0, 2])
        groups = low.reduction_groups()
        assert sorted(d for g in groups for d in g) == list(range(32))
        assert sorted(map(sorted, groups)) == sorted(map(sorted, m.reduction_groups((2, 4, 4), [0, 2])))
        # Every DSL group lowers into one reduction group.
        where = {d: i for i, g in enumerate(groups) for d in g}
        for slice_level, form in low.hierarchy.instructions():
            for g in low.lower(low.hierarchy.groups(slice_level, form)):
                assert len({where[d] for d in g}) == 1


def test_dsl_round_trip():
    text = "ReduceScatter(node, InsideGroup); AllReduce(node, Parallel(root)); AllGather(node, InsideGroup)"
    program = parse_program(text)
    assert format_program(program) == text
    assert parse_program(format_program(program, "\n")) == program
    assert parse_program("all_reduce(node , parallel( root ))  # comment\n") == parse_program("AllReduce(node, Parallel(root))")


@pytest.mark.parametrize("text, message", [
    ("AllReduce(node)", "does not read"), ("AllToAll(node, InsideGroup)", "unknown collective"), ("", "no instruction"),
    ("AllReduce(node, Sideways(root))", "does not read"),
])
def test_dsl_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_program(text)
