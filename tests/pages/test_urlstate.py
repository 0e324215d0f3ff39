"""Controls ↔ URL query parameters: round trips, defaults left out, bad values reported not raised."""

import pytest

from divviz.catalogue.divergences import CLIP_TESTS
from divviz.catalogue.params import Param
from divviz.app.urlstate import Control, measure_param_controls, read_query, write_query

CONTROLS = [
    Control("m", ["ratio", "kl3"], options=tuple(CLIP_TESTS), multi=True),
    Control("agg", "grpo", options=("grpo", "bnpo")),
    Control("dual", False, param=Param("dual", False, kind="bool")),
    *measure_param_controls(),
]


def test_round_trip_and_short_links():
    values = {"m": ["kl3", "prob_tv"], "agg": "bnpo", "dual": True, "kl3.delta": 0.0231436, "ratio.eps": 0.2}
    query = write_query(CONTROLS, values)
    assert query == {"m": "kl3,prob_tv", "agg": "bnpo", "dual": "1", "kl3.delta": "0.0231436"}  # eps=0.2 is default
    back, problems = read_query(CONTROLS, query)
    assert problems == [] and back == {k: v for k, v in values.items() if k != "ratio.eps"}


@pytest.mark.parametrize("query, problem", [
    ({"kl3.delta": "nan"}, "link: 'kl3.delta' must be a number in [0.0001, 0.5] (the control's range; divviz takes "
                           "(0, 50] where it is typed, e.g. `divviz train`); got 'nan'"),
    ({"kl3.delta": "7"}, "link: 'kl3.delta' must be a number in [0.0001, 0.5] (the control's range; divviz takes "
                         "(0, 50] where it is typed"),  # one range per message: the control's, then why another
    ({"m": "ratio,kl9"}, "'m' has unknown value 'kl9'"),
    ({"agg": "mean"}, "'agg' has unknown value 'mean'; choose grpo or bnpo"),
    ({"dual": "maybe"}, "link: 'dual' must be 0 or 1 (false/true); got 'maybe'"),
])
def test_bad_values_are_reported(query, problem):
    values, problems = read_query(CONTROLS, query)
    assert values == {} and len(problems) == 1 and problem in problems[0]


def test_unknown_keys_are_ignored():
    assert read_query(CONTROLS, {"utm_source": "x"}) == ({}, [])


def test_every_clip_parameter_has_a_control():
    names = {c.name for c in measure_param_controls()}
    assert names == {f"{e.name}.{p.name}" for e in CLIP_TESTS.values() for p in e.params}


MEASURES = [Control("m", ["ratio", "kl3"], family="clip")]


def test_a_list_of_measures_may_repeat_one_with_other_parameters():
    query = write_query(MEASURES, {"m": ["kl3:delta=0.0177", "kl3:delta=0.0231", "kl3"]})
    assert query == {"m": "kl3:delta=0.0177,kl3:delta=0.0231,kl3"}
    assert read_query(MEASURES, query) == ({"m": ["kl3:delta=0.0177", "kl3:delta=0.0231", "kl3"]}, [])
    # spelled as instances.spell writes it: defaults dropped, whatever the link wrote
    assert read_query(MEASURES, {"m": "kl3:delta=0.05,clip_higher:eps_high=0.28:eps_low=0.1"})[0] == {
        "m": ["kl3", "clip_higher:eps_low=0.1"]}


def test_old_links_set_the_parameters_of_bare_names():
    assert read_query(MEASURES, {"m": "ratio,kl3", "kl3.delta": "0.02"}) == ({"m": ["ratio", "kl3:delta=0.02"]}, [])
    assert read_query(MEASURES, {"ratio.eps": "0.1"}) == ({"m": ["ratio:eps=0.1", "kl3"]}, [])  # on the default list
    assert read_query(MEASURES, {"m": "kl3:delta=0.03", "kl3.delta": "0.02"})[0] == {"m": ["kl3:delta=0.03"]}


@pytest.mark.parametrize("text, problem", [
    ("kl3:delta=7", "'kl3:delta' must be a number in [0.0001, 0.5] (the control's range"),
    ("kl3:delta=nan", "'delta' must be a finite number in (0, 50]; got 'nan'"),
    ("kl3:eps=0.2", "kl3: unknown parameter 'eps'"),
    ("kl3:delta", "expected NAME=VALUE, got 'delta'"),
    ("kl9", "unknown clip test 'kl9'"),
    ("x" * 800, "at most 700 characters"),
])
def test_bad_measures_in_a_link_are_reported(text, problem):
    values, problems = read_query(MEASURES, {"m": text})
    assert values == {} and len(problems) == 1 and problem in problems[0]


def test_instances_spell_and_label():
    from divviz.catalogue import instances

    test = instances.parse("clip_higher:eps_low=0.1")
    assert test.params == {"eps_low": 0.1, "eps_high": 0.28} and instances.spell(test) == "clip_higher:eps_low=0.1"
    assert instances.spell(instances.parse("kl3:delta=0.05")) == "kl3"
    assert instances.spell(instances.parse("k3:importance_weight=1", "penalty")) == "k3:importance_weight=1"
    assert instances.unique_labels(["a", "b", "a", "a"]) == ["a", "b", "a (2)", "a (3)"]
