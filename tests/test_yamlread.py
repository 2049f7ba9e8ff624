"""The plan file's fast YAML reader gives what PyYAML's safe loader gives: the same data, or
the same error, on every text (plan files, hand edits, YAML's corner cases)."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.plan import yamlread
from solver_planner.plan.yamltext import dump

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def same(a, b) -> bool:
    """Equal data of equal types all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(k, m) and same(a[k], b[m]) for k, m in zip(a, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def outcome(load, text):
    try:
        return "data", load(text)
    except yaml.YAMLError as exc:
        return "error", type(exc).__name__


def assert_same(text: str) -> None:
    ours, theirs = outcome(yamlread.load, text), outcome(lambda t: yaml.load(t, Loader=LOADER), text)
    assert ours[0] == theirs[0], (text, ours, theirs)
    assert same(ours[1], theirs[1]) if ours[0] == "data" else ours == theirs, (text, ours, theirs)


CORNERS = [
    "", "~", "null", "a: 1\na: 2\n", "a: [1, 2]\nb: {c: d}\n", "x: yes\ny: No\nz: on\n",
    "t: 2026-11-27\nu: 2026-11-27 10:00:00\n", "n: .nan\ni: -.inf\nh: 0x1F\no: 0o17\ns: 1:30\nb: 0b101\n",
    "q: '12'\nr: \"1.5\"\n", "u: 1_000\nf: 1e3\ng: 6.8e+5\n",
    "base: &b {x: 1}\nder:\n  <<: *b\n  y: 2\n",                 # anchors, aliases, a merge key
    "m:\n  <<: {x: 1}\n  y: 2\n",                                    # a merge key without aliases
    "=: 1\n", "a: =\n",                                              # YAML 1.1's value key
    "a: !!str 12\n", "a: !!set {x, y}\n", "a: ! 12\n", "!!map {a: 1}\n", "a: !!python/tuple [1]\n",
    "? [1, 2]\n: x\n", "? {a: 1}\n: x\n", "? a\n: b\n",
    "--- 1\n--- 2\n", "---\na: 1\n...\n", "a: [1, , 2]\n", "a: b: c\n", "- a\n- - b\n  - c\n- {}\n- []\n",
    "a: 'it''s'\nb: \"\\u00e9\\t\"\nc: |\n  two\n  lines\nd: >\n  folded\n  text\n",
    "key with spaces: value with spaces\n", "'': empty key\n", "a:\n",
]


@pytest.mark.parametrize("text", CORNERS)
def test_corner_cases_read_as_pyyaml_reads_them(text):
    assert_same(text)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["yes", "~", "1:2", "0x10", "=", "<<", ".inf", "1_0", "2001-01-01"]))
data = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=6) | st.integers(), inner,
                                                                     max_size=4)), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(data, st.sampled_from([None, True, False]))
def test_any_dumped_data_reads_as_pyyaml_reads_it(value, flow):
    assert_same(yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True))


@settings(max_examples=200, deadline=None)
@given(data)
def test_what_the_plan_writer_writes_reads_back_equal(value):
    try:
        text = dump(value)
    except ValueError:            # lone surrogates: the writer refuses them
        return
    assert_same(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab:-[]{},?!&*<=> \n'\"#|.01", max_size=40))
def test_arbitrary_text_reads_or_fails_as_pyyaml_does(text):
    assert_same(text)


@pytest.mark.parametrize("text, line", [
    ("a: 1\nb: 2\na: 3\n", 3),                      # the last value would win silently
    ("x:\n  y: [1]\n  z: 2\n  y: [2]\n", 4),        # nested, a repeated key whose value is a list
    ("- {a: 1, a: 1}\n", 1),                        # even the same value twice
    ("1: a\n1.0: b\n", 2),                          # one key to Python
    ("t: !!str 5\nt: 6\n", 2),                      # through PyYAML's loader (a tag)
    ("a: &x [1]\nb: *x\n", 2),                      # an alias
    ("a: !!str &x 1\nb: *x\n", 2),                  # an alias after a tag
    ("k: 1\n<<: {k: 2}\n", 2),                      # a merge key: PyYAML would drop k: 2 silently
    ("t: !!str 1\nk: 1\n<<: {k: 2}\n", 3),          # ... through PyYAML's loader
    ("v: !!int 1\n1: a\n0x1: b\n", 3),              # one key to Python, through PyYAML's loader
    ("t: !!str 1\nx:\n  a: 1\n  a: 2\ny:\n  b: 1\n  b: 2\n", 4),   # the first repeat, in document order
    ("z: " + "[" * 65 + "]" * 65 + "\n", 1),         # nested deeper than MAX_DEPTH
    ("x: !!str y\nz: " + "[" * 30000 + "]" * 30000 + "\n", 2),   # libyaml's composer would crash
])
def test_strict_refuses_a_repeated_key_or_an_alias_with_its_line(text, line):
    with pytest.raises(yamlread.Refused) as err:
        yamlread.load(text, strict=True)
    assert err.value.line == line, str(err.value)
    if text.count("[") < 1000:                      # (PyYAML's own loader crashes on the deepest)
        assert yamlread.load(text) == yaml.load(text, Loader=LOADER)      # not strict: PyYAML's reading


def test_strict_reads_an_unused_anchor_and_loose_reads_deep_nesting_without_recursion():
    assert yamlread.load("a: &x [1, 2]\nb: 3\n", strict=True) == {"a": [1, 2], "b": 3}
    deep = "x: " + "[" * 5000 + "]" * 5000 + "\n"          # a stack of open collections
    value = yamlread.load(deep)["x"]
    for _ in range(4999):
        (value,) = value
    assert value == []


@pytest.mark.parametrize("text", ["a: 2001-02-30\n", "a: 2001-02-30\nb: [\n", "a: " + "1" * 5000 + "\n",
                                  "a: !!bool foo\n", "a: [1, 2001-02-30]\nb: {c: ]\n"])
def test_a_value_python_cannot_build_fails_as_pyyaml_fails(text):
    """PyYAML raises what its constructor raises (ValueError for 30 February), or its parser's
    error first when the text is also malformed: the fast path lets PyYAML decide."""
    def failure(load):
        try:
            load(text)
        except Exception as exc:       # noqa: BLE001 -- the exception's type is what is compared
            return type(exc)
        return None
    assert failure(yamlread.load) == failure(lambda t: yaml.load(t, Loader=LOADER)) is not None
