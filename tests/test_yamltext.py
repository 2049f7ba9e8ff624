"""The plan file's YAML writer: what it writes loads back equal, under PyYAML's safe loaders."""

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from solver_planner.plan import yamltext

LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])

scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
           | st.floats(allow_nan=False) | st.text(max_size=12)
           | st.sampled_from(["yes", "No", "on", "OFF", "null", "~", "1e5", "1.5", "0x1f", "12:30", ".inf", "-",
                              "a: b", "# c", "[x]", "{y}", "2026-11-26", "'q'", '"d"', "a\nb", " lead", "tail ",
                              "\u2028", "\x85", "\ufeff", "\x7f", "tab\there", "<<", "=", "_1", "e1", ""]))
keys = st.text(max_size=10) | st.integers(-5, 5)
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(data)
def test_what_it_writes_loads_back_equal(doc):
    text = yamltext.dump(doc)
    for loader in LOADERS:
        assert yaml.load(text, Loader=loader) == doc, text


def test_floats_keep_their_type_and_value():
    doc = {"a": 1e-05, "b": 1e300, "c": float("inf"), "d": -float("inf"), "e": 0.1, "f": -0.0, "g": 3.0}
    back = yaml.safe_load(yamltext.dump(doc))
    assert back == doc and all(isinstance(v, float) for v in back.values())
    assert math.isnan(yaml.safe_load(yamltext.dump({"n": float("nan")}))["n"])


def test_what_is_not_plain_data_is_refused():
    with pytest.raises(TypeError, match="tuple"):
        yamltext.dump({"a": (1, 2)})
    with pytest.raises(TypeError, match="set"):
        yamltext.dump({"a": [{1}]})


def test_a_lone_surrogate_is_refused_when_written():
    with pytest.raises(ValueError, match="surrogate"):
        yamltext.dump({"k": "\ud800"})
