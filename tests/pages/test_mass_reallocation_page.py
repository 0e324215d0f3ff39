"""The Mass reallocation (bandit) page under streamlit's AppTest: its runs over seeds, measures that repeat,
surrogates, penalties, rollout corrections under a lagging sampler, and its reward settings."""

import json

import pytest

from tests.page_helpers import open_page, open_tab, shown, slider, specs, titles


def test_mass_reallocation_page():
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "20", "k": "20"})
    assert len(at.metric) == 3 and "n = 8" in at.metric[0].delta and "band [" in at.metric[0].delta
    assert not at.warning  # at the default lr no sample passes u in the first optimiser step
    # distribution, mass, the open tab's curves (reward, entropy, mass) and the paired difference: a change redraws
    # four charts, not six: only the open tab is drawn
    assert [t.label for t in at.tabs] == ["Reward, entropy and mass", "Clip fractions and KL", "Why the entropy moves"]
    drawn = ["Distribution before and after", "Mass reallocation", "Expected reward, entropy", "expected_reward: each"]
    assert len(titles(at)) == 4 and all(title.startswith(start) for title, start in zip(titles(at), drawn))
    open_tab(at, "bandit:tab", "Clip fractions and KL")
    assert len(titles(at)) == 4 and titles(at)[2].startswith("How often each clip binds")
    open_tab(at, "bandit:tab", "Why the entropy moves")
    assert any("change_predicted" in spec for spec in specs(at))  # why the entropy moves: observed, predicted
    next(t for t in at.toggle if "Attribute the entropy" in t.label).set_value(True).run()
    assert not at.exception and len(specs(at)) == 5  # … and who moves it
    assert any("masked high, had they been let through" in spec and "observed" in spec for spec in specs(at))
    before = specs(at)
    slider(at, "delta").set_value(0.2).run()
    assert not at.exception and specs(at) != before
    table = at.dataframe[0].value
    assert set(table.measure) == {"clip_higher ε_low=0.2 ε_high=0.28", "kl3 δ=0.2"} and (table.n == 8).all()
    slider(at, "At iteration").set_value(5).run()
    assert not at.exception and not at.dataframe[0].value.difference.equals(table.difference)
    # Adam starts from its own learning rate
    next(s for s in at.selectbox if s.label == "Optimiser").set_value("adam").run()
    assert not at.exception and slider(at, "lr").value == pytest.approx(0.05)
    # a large step is flagged
    slider(at, "lr").set_value(20.0).run()
    next(s for s in at.selectbox if s.label == "Optimiser").set_value("sgd").run()
    slider(at, "lr").set_value(8.0).run()
    assert not at.exception and "already above u after the first optimiser step" in at.warning[0].value
    # an impossible combination is a message in the page, not a traceback
    slider(at, "correct_rank: ranks 0 … this one are correct").set_value(30).run()
    assert not at.exception and "'correct_rank' must be below k = 20" in shown(at.error[0])


def test_mass_reallocation_the_same_measure_twice_and_one_seed():
    at = open_page("app_pages/mass_reallocation.py",
                   {"iterations": "15", "k": "20", "m": "kl3:delta=0.0177,kl3", "seeds": "3"})
    table = at.dataframe[0].value
    assert list(table.measure.unique()) == ["kl3 δ=0.05"] and (table.n == 3).all()
    assert [m.label for m in at.metric] == ["kl3 δ=0.0177", "kl3 δ=0.05"]
    slider(at, "Seeds per objective").set_value(1).run()
    assert not at.exception and "n = 1" in at.metric[0].delta



def test_mass_reallocation_compares_rollout_corrections_under_a_lagging_sampler():
    """A link with a bfloat16 sampler three iterations behind and three corrections: a run per measure and correction,
    labelled with the correction, verl's rollout chart beside the others, and paired differences between them; the
    on-policy page draws no rollout chart."""
    query = {"iterations": "15", "k": "20", "m": "kl3", "seeds": "3", "lr": "2", "rollout_dtype": "bfloat16",
             "rollout_lag": "3", "rc": "none,TIS token,rejection", "tis_u": "1.1", "rs_option": "token_k1",
             "rs_l": "0.95", "rs_u": "1.05"}
    at = open_page("app_pages/mass_reallocation.py", query)
    assert [m.label for m in at.metric] == ["kl3 δ=0.05", "kl3 δ=0.05 · TIS token u=1.1",
                                            "kl3 δ=0.05 · RS token_k1 0.95_1.05"]
    assert [t.label for t in at.tabs][-1] == "Sampler and corrections"
    open_tab(at, "bandit:tab", "Sampler and corrections")
    rollout = next(f for f in map(json.loads, specs(at)) if "KL(π_roll" in f["layout"]["title"]["text"])
    assert [t["name"] for t in rollout["data"] if t.get("showlegend", True) and "name" in t] == [
        "kl3 δ=0.05", "kl3 δ=0.05 · TIS token u=1.1", "kl3 δ=0.05 · RS token_k1 0.95_1.05"]
    table = at.dataframe[0].value
    assert set(table.measure) == {"kl3 δ=0.05 · TIS token u=1.1", "kl3 δ=0.05 · RS token_k1 0.95_1.05"}
    assert not table.difference.eq(0).all()
    on_policy = open_page("app_pages/mass_reallocation.py", {"iterations": "15", "k": "20", "m": "kl3"})
    assert not any("π_roll" in json.loads(spec)["layout"]["title"]["text"] for spec in specs(on_policy))


def test_mass_reallocation_trains_surrogates_and_says_what_it_refuses():
    """A surrogate is a run of its own (dppo masks with the first clip test); at the sequence level a bandit's
    one-token completion trains as at the token level, and what the level refuses is named, not trained."""
    query = {"iterations": "15", "k": "20", "m": "ratio,prob_tv", "s": "cispo:hi=1.28,sapo,dppo", "seeds": "2"}
    at = open_page("app_pages/mass_reallocation.py", {**query, "s": "kl_cov,clip_cov"})
    assert [m.label for m in at.metric] == ["ratio ε=0.2", "prob_tv δ=0.1", "kl_cov"]
    assert "Not trained: clip_cov: it draws its tokens at random" in shown(at.warning[0])
    at = open_page("app_pages/mass_reallocation.py", query)
    labels = [m.label for m in at.metric]
    assert labels == ["ratio ε=0.2", "prob_tv δ=0.1", "cispo hi=1.28", "sapo", "dppo with ratio ε=0.2"]
    token = [m.value for m in at.metric]
    assert len(set(token)) > 1 and not at.warning
    at = open_page("app_pages/mass_reallocation.py", {**query, "level": "sequence"})
    refused = " ".join(shown(w) for w in at.warning)
    assert "Not trained: prob_tv δ=0.1: the clip test prob_tv depends on π_old" in refused
    assert "dppo" in refused and "has a level of its own" in refused
    assert [m.label for m in at.metric] == ["ratio ε=0.2 (sequence)", "cispo hi=1.28 (sequence)",
                                            "sapo (sequence)"]
    assert [m.value for m in at.metric] == [token[0], token[2], token[3]]  # one token: the same runs


def test_mass_reallocation_with_two_penalties_and_a_batch_baseline():
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "10", "k": "20", "m": "kl3", "pen": "k3",
                                                      "pen2": "prob_l2", "beta2": "0.2", "baseline": "batch",
                                                      "scale_rewards": "none"})
    assert [m.label for m in at.metric] == ["kl3 δ=0.05 + 0.05·k3 + 0.2·prob_l2"] and not at.warning
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "10", "k": "20", "pen": "k3", "pen2": "k3"})
    assert "The second penalty is the first one again" in at.warning[0].value and not at.exception
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "10", "k": "20", "scale_rewards": "0"})
    assert at.selectbox(key="bandit:scale_rewards").value == "none" and not at.warning  # an older link's toggle


def test_a_bandit_preset_with_surrogates_and_one_without():
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "10", "k": "20"})
    next(b for b in at.button if b.label.startswith("PPO vs surrogates")).click().run()
    assert not at.exception and at.query_params["s"] == "cispo:hi=1.28,sapo,dppo"
    next(b for b in at.button if b.label == "A rare correct action (rank 10)").click().run()
    assert not at.exception and "s" not in at.query_params and len(at.metric) == 3
    next(b for b in at.button if b.label.startswith("A sampler 2 iterations behind")).click().run()
    assert not at.exception and at.query_params["rollout_lag"] == "2"
    assert [m.label for m in at.metric] == ["ratio ε=0.2", "ratio ε=0.2 · TIS token u=2",
                                            "ratio ε=0.2 · IcePop token [0.5, 2]", "ratio ε=0.2 · bypass"]
    next(b for b in at.button if b.label.startswith("PPO vs DAPO vs KL3")).click().run()  # back on-policy
    assert not at.exception and "rollout_lag" not in at.query_params and "rc" not in at.query_params
    assert len(at.metric) == 3


def test_the_bandits_reward_settings_say_what_they_mean_and_show_only_when_they_apply():
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "10", "k": "20", "m": "kl3", "seeds": "2"})
    labels = {s.label for s in at.slider}
    assert "K, the number of actions" in labels and "correct_rank: ranks 0 … this one are correct" in labels
    assert not any(label.startswith("correct_percent") for label in labels)
    next(s for s in at.selectbox if s.label == "Reward").set_value("random_correct").run()
    labels = {s.label for s in at.slider}
    assert not at.exception and "correct_percent: the share of actions that are correct (%)" in labels
    assert not any(label.startswith("correct_rank") for label in labels)
