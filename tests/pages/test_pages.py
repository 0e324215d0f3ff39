"""Each page under streamlit's AppTest: runs clean, draws its charts, reacts to a control, and restores
its controls from a shared link. The Mass reallocation page has its own file."""

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from divviz.catalogue.rollout_correction import CORRECTIONS

from tests.page_helpers import APP, add_measure, click, measure_labels, open_page, open_tab, shown, slider, specs, titles, typed


def test_home_page():
    at = open_page()
    assert at.title[0].value == "divviz"
    assert len(specs(at)) == 1


def test_catalogue_page_lists_every_measure():
    at = open_page("app_pages/catalogue.py")
    text = " ".join(m.value for m in at.markdown)
    for name in ("ratio", "clip_higher", "kl3", "prob_tv", "prob_l2", "mirror", "urkl_rf"):
        assert f"`{name}`" in text
    for name, entry in CORRECTIONS.items():  # verl's rollout corrections, each with its sibling and its flags
        assert f"`{name}`" in text and f"*Beside `{entry.sibling}`:* {entry.how}." in text
        assert any(entry.flags in c.value for c in at.caption)
    assert all(e.sibling in CORRECTIONS and e.sibling != name for name, e in CORRECTIONS.items())


def test_clipping_regions_page_reacts_and_shares():
    at = open_page("app_pages/clipping_regions.py")
    before = specs(at)  # intervals, sweeps, surrogate and the open tab's gradient weight: four charts to redraw on a
    assert len(before) == 4 and [t.label for t in at.tabs] == ["Gradient weight", "Penalties", "Probability space"]
    slider(at, "delta").set_value(0.1).run()  # change, not seven: only the open tab is drawn
    assert not at.exception
    after = specs(at)
    assert all(a != b for a, b in zip(before, after))  # the tests' figures followed δ
    assert at.query_params["m"] == "ratio,clip_higher,kl3:delta=0.1"
    open_tab(at, "regions:tab", "Probability space")  # the open tab is in the link
    assert titles(at)[3].startswith("Feasible region") and titles(at)[4].startswith("Logit room")
    assert at.query_params["tab"] == "Probability space"
    assert titles(open_page("app_pages/clipping_regions.py", {"tab": "Probability space"}))[3:] == titles(at)[3:]
    unknown = open_page("app_pages/clipping_regions.py", {"tab": "Rollout corrections"})  # none chosen: the first tab
    assert titles(unknown)[3].startswith("Gradient weight") and not unknown.exception
    bogus = open_page("app_pages/clipping_regions.py", {"tab": "<b>Logs</b>"})
    assert "'tab' has unknown value" in shown(bogus.warning[0]) and len(specs(bogus)) == 4
    # choose other tests; the URL follows
    for _ in range(3):
        click(at, "Remove")
    add_measure(at, "kl2")
    add_measure(at, "prob_tv")
    assert at.query_params["m"] == "kl2,prob_tv"
    assert json.loads(specs(at)[0])["data"][0]["name"].startswith("kl2")


def test_clipping_regions_builds_only_the_charts_it_shows(monkeypatch):
    from divviz.views import plots

    built = []
    for name in ("interval_chart", "sweep_chart", "gradient_weight_chart", "penalty_chart", "correction_chart",
                 "region_chart", "logit_chart"):
        chart = getattr(plots, name)
        monkeypatch.setattr(plots, name, lambda *a, _chart=chart, _name=name, **k: built.append(_name) or _chart(*a, **k))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert built == []  # the home page builds the one chart it shows, the surrogate
    at.switch_page("app_pages/clipping_regions.py").run()
    assert set(built) == {"interval_chart", "sweep_chart", "gradient_weight_chart"}  # not the hidden tabs' charts
    built.clear()
    open_tab(at, "regions:tab", "Probability space")
    assert set(built) == {"interval_chart", "sweep_chart", "region_chart", "logit_chart"}


def test_the_same_measure_twice_with_its_own_parameters():
    at = open_page("app_pages/clipping_regions.py", {"m": "kl3"})
    click(at, "Duplicate")
    assert measure_labels(at) == ["kl3 δ=0.05", "kl3 δ=0.05 (2)"]  # distinct labels, even when equal
    [s for s in at.slider if s.label == "delta"][1].set_value(0.0177).run()
    assert measure_labels(at) == ["kl3 δ=0.05", "kl3 δ=0.0177"]
    assert at.query_params["m"] == "kl3,kl3:delta=0.0177"
    names = [trace["name"] for trace in json.loads(specs(at)[0])["data"]]
    assert "kl3 δ=0.05" in names and "kl3 δ=0.0177" in names
    # the link opens the same two, each with its own δ
    again = open_page("app_pages/clipping_regions.py", {"m": at.query_params["m"]})
    assert [s.value for s in again.slider if s.label == "delta"] == pytest.approx([0.05, 0.0177])
    click(again, "Remove", 1)
    assert measure_labels(again) == ["kl3 δ=0.05"] and again.query_params["m"] == "kl3"


def test_clipping_regions_link_restores_controls():
    at = open_page("app_pages/clipping_regions.py", {"m": "ratio,kl3:delta=0.02", "dual": "1", "c": "2"})
    assert measure_labels(at) == ["ratio ε=0.2", "kl3 δ=0.02"]
    assert slider(at, "delta").value == pytest.approx(0.02)
    assert slider(at, "dual-clip c").value == pytest.approx(2.0)
    assert "[0.8131, 1.2135]" in specs(at)[0]  # the interval chart shows δ = 0.02's interval


def test_links_made_before_measures_could_repeat_still_open():
    at = open_page("app_pages/clipping_regions.py", {"m": "ratio,kl3", "kl3.delta": "0.02"})
    assert not at.warning and measure_labels(at) == ["ratio ε=0.2", "kl3 δ=0.02"]
    assert "[0.8131, 1.2135]" in specs(at)[0]
    assert at.query_params["m"] == "ratio,kl3:delta=0.02" and "kl3.delta" not in at.query_params


def test_bad_link_values_warn_and_fall_back():
    at = open_page("app_pages/clipping_regions.py", {"kl3.delta": "nan", "m": "ratio,bogus"})
    warnings = " ".join(shown(w) for w in at.warning)
    assert "'kl3.delta' must be a number in [0.0001, 0.5]" in warnings and "unknown clip test 'bogus'" in warnings
    assert slider(at, "delta").value == pytest.approx(0.05)
    assert len(specs(at)) == 4


def test_clipping_regions_preset_and_empty_selection():
    at = open_page("app_pages/clipping_regions.py")
    next(b for b in at.button if b.label.startswith("KL1 vs KL2")).click().run()
    assert measure_labels(at) == ["kl1 δ=0.05", "kl2 δ=0.05", "kl3 δ=0.05"]
    for _ in range(3):
        click(at, "Remove")
    assert not at.exception and "Pick at least one clip test" in at.info[0].value


def test_kl3_page_check_and_reaction():
    at = open_page("app_pages/kl3_equivalence.py", {"delta": "0.1"})
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["l_δ"] == "0.616817" and metrics["u_δ"] == "1.516221"
    assert at.success and "Identical to 1e-12" in at.success[0].value
    before = specs(at)
    slider(at, "KL3 level δ").set_value(0.02).run()
    assert {m.label: m.value for m in at.metric}["u_δ"] == "1.213550"
    assert specs(at) != before


def test_clipping_regions_draws_rollout_corrections():
    """A link's corrections draw their multipliers against ρ = π_old/π_roll: TIS capped at its u, IcePop zero
    outside [l, u], rejection 0 or 1; bypass is named, not drawn; without corrections there is no such chart."""
    at = open_page("app_pages/clipping_regions.py", {"rc": "TIS token,IcePop token,rejection,bypass", "tis_u": "1.5",
                                                     "tab": "Rollout corrections"})
    figure = next(f for f in map(json.loads, specs(at)) if f["layout"]["title"]["text"].startswith("Rollout"))
    curves = {t["name"]: (typed(t["x"]), typed(t["y"])) for t in figure["data"] if "name" in t}
    assert list(curves) == ["TIS token u=1.5", "IcePop token [0.5, 2]", "RS token_k1 0.5_2"]
    rho, tis = curves["TIS token u=1.5"]
    assert tis.max() == pytest.approx(1.5) and tis[rho < 1.5] == pytest.approx(rho[rho < 1.5])
    assert set(curves["RS token_k1 0.5_2"][1]) == {0.0, 1.0} and curves["IcePop token [0.5, 2]"][1][-1] == 0
    assert any("Bypass mode is not drawn" in c.value for c in at.caption)
    assert not any("Rollout" in json.loads(s)["layout"]["title"]["text"]
                   for s in specs(open_page("app_pages/clipping_regions.py")))


def test_a_typed_formula_on_the_clipping_regions_page():
    """A link carries a typed formula; typing another redraws; a refused one says why in its expander, and the page
    keeps drawing the last good formula (the link too)."""
    at = open_page("app_pages/clipping_regions.py", {"m": "kl3,formula:f=max(w%2C 1/w) - 1:delta=0.5"})
    assert measure_labels(at) == ["kl3 δ=0.05", "formula max(w, 1/w) - 1 δ=0.5"]
    assert "[0.6667, 1.5000]" in specs(at)[0]  # max(w, 1/w) − 1 ≤ 0.5 ⇔ 1/1.5 ≤ w ≤ 1.5
    box = next(t for t in at.text_input if t.label == "f")
    box.set_value("abs(log(w))").run()
    assert not at.exception and at.query_params["m"] == "kl3,formula:f=abs(log(w)):delta=0.5"
    assert "[0.6065, 1.6487]" in specs(at)[0]
    box.set_value('__import__("os").system("touch /tmp/owned")').run()
    assert not at.exception and len(specs(at)) == 4
    assert "is not allowed" in shown(at.error[0]) and "still shown: formula abs(log(w))" in shown(at.error[0])
    assert at.query_params["m"] == "kl3,formula:f=abs(log(w)):delta=0.5"  # the last good formula stays


def test_the_clipping_regions_page_draws_surrogates_gradient_weights_and_shares_them():
    """The gradient-weight chart has each clip test (PPO's surrogate) and each chosen surrogate, for A = ±1; a
    surrogate is added from its own list, and the link carries the list (with its parameters)."""
    at = open_page("app_pages/clipping_regions.py", {"m": "kl3", "s": "cispo:hi=1.28"})
    def weight_chart(at):
        return next(c for c in map(json.loads, specs(at)) if "Gradient weight" in c["layout"]["title"]["text"])

    weight = weight_chart(at)
    assert {t["name"] for t in weight["data"]} == {"kl3 δ=0.05", "cispo hi=1.28"}
    next(s for s in at.selectbox if s.label == "Add a surrogate").set_value("dppo").run()
    assert not at.exception and at.query_params["s"] == "cispo:hi=1.28,dppo"
    names = {t["name"] for t in weight_chart(at)["data"]}
    assert "dppo with kl3 δ=0.05" in names
    for link, says in (("nope", "unknown surrogate 'nope'"), ("sapo:tau_pos=0", "tau_pos")):
        at = open_page("app_pages/clipping_regions.py", {"s": link})
        assert says in " ".join(shown(w) for w in at.warning) and not at.exception


def test_a_refused_formula_in_a_link_is_reported():
    at = open_page("app_pages/clipping_regions.py", {"m": "formula:f=(w-1)**2*(w-3)**2"})
    assert "is not one interval" in " ".join(shown(w) for w in at.warning)
    assert len(specs(at)) == 4  # the default measures instead


def test_a_formula_can_be_added_from_the_list():
    at = open_page("app_pages/clipping_regions.py", {"m": "kl3"})
    add_measure(at, "formula")
    assert measure_labels(at) == ["kl3 δ=0.05", "formula w - 1 - log(w) δ=0.05"]
    first, second = (json.loads(specs(at)[0])["data"][i] for i in (0, 1))
    assert first["x"] == second["x"]  # the typed KL3 has KL3's interval


def test_the_clipping_regions_page_draws_penalties_with_their_parameters():
    """Penalties are drawn as their value and slope against π_θ/π_ref; k3's slope is 1 − 1/r at any π_ref, ProbL2's
    2p(p − p_ref) vanishes for a rare token; a penalty's parameter and the choice travel in the link."""
    at = open_page("app_pages/clipping_regions.py", {"p": "k3,prob_l2,abs", "pi_old": "0.01", "abs.straight_through": "1",
                                                     "tab": "Penalties"})
    chart = next(c for c in map(json.loads, specs(at)) if "Penalties" in c["layout"]["title"]["text"])
    slopes = {t["name"]: t for t in chart["data"] if t["xaxis"] == "x2"}
    assert set(slopes) == {"k3", "prob_l2", "abs straight_through"}
    ratio = typed(slopes["k3"]["x"])
    at_two = int(np.argmin(abs(ratio - 2.0)))
    k3 = typed(slopes["k3"]["y"])[at_two]
    assert k3 == pytest.approx(1 - 1 / ratio[at_two], rel=1e-9)
    p = 0.01 * ratio[at_two]
    assert typed(slopes["prob_l2"]["y"])[at_two] == pytest.approx(2 * p * (p - 0.01), rel=1e-9)
    assert at.query_params["p"] == "k3,prob_l2,abs" and at.query_params["abs.straight_through"] == "1"


def test_the_paired_iteration_and_the_claims_settings_are_in_the_link():
    """A teacher shares "look at iteration 10": the link opens the paired differences there, and moving it moves
    the link; the Claims page's seeds and its LM cells' settings travel the same way."""
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "20", "k": "20", "m": "ratio,kl3", "seeds": "2",
                                                     "diff_at": "10"})
    assert not at.exception and slider(at, "At iteration").value == 10
    slider(at, "At iteration").set_value(15).run()
    assert at.query_params["diff_at"] == ["15"] or at.query_params["diff_at"] == "15"
    at = open_page("app_pages/claims.py", {"seeds": "4", "lm_model": "smollm2-135m", "lm_steps": "30",
                                           "lm_pilot_extra": "4", "claim": "kl3_training"})
    assert not at.exception and at.slider[0].value == 4 and at.selectbox(key="claims:claim").value == "kl3_training"
    assert at.selectbox(key="claims:lm_model").value == "smollm2-135m"
    assert at.number_input(key="claims:lm_steps_of:smollm2-135m:stress").value == 30  # the page opens at stress
    assert at.number_input(key="claims:lm_pilot_extra").value == 4
    assert at.selectbox(key="claims:lm_setting").options == ["learn", "stress"]  # not "look only": no evaluations


def test_a_link_to_a_setting_opens_its_declared_grid(repository_published):
    """A link naming SmolLM2's learn setting and no seeds opens the learn grid as declared (4 seeds, the pilot pair 4
    more: 44 runs, of which the published ones are read), not the stress grid's seeds; seeds the link names win."""
    at = open_page("app_pages/claims.py", {"lm_setting": "learn", "claim": "kl3_training"})
    assert not at.exception and at.selectbox(key="claims:lm_setting").value == "learn"
    assert (at.slider(key="claims:lm_seeds").value, at.number_input(key="claims:lm_pilot_extra").value) == (4, 4)
    assert any("of the 44 runs are published" in info.value for info in at.info)
    at = open_page("app_pages/claims.py", {"lm_setting": "learn", "lm_pilot_extra": "2"})
    assert at.number_input(key="claims:lm_pilot_extra").value == 2


def test_the_lab_shows_a_real_models_learning_rate_and_offers_its_settings():
    """SmolLM2's learning rate 5e-5 reads 5.00e-05, not 0.0000 (a slider's fixed decimals); choosing its stress setting
    puts the stress learning rate into the widgets, and the mini-batch and precision controls are there."""
    from divviz.engine.models import SMOLLM2_SETTINGS

    at = open_page("app_pages/training_lab.py")
    at.sidebar.selectbox(key="lab:model").set_value("smollm2-135m").run()
    lr = at.sidebar.number_input(key="lab:lr")
    assert lr.value == SMOLLM2_SETTINGS["learn"]["lr"] and lr.proto.format == "%.2e"
    at.sidebar.selectbox(key="lab:setting").set_value("stress").run()
    assert not at.exception and at.sidebar.number_input(key="lab:lr").value == SMOLLM2_SETTINGS["stress"]["lr"]
    assert at.sidebar.slider(key="lab:minibatches").value == SMOLLM2_SETTINGS["stress"]["minibatches"]
    assert at.sidebar.selectbox(key="lab:dtype").value == "auto"


def test_a_link_naming_smollm2_alone_opens_the_lab_with_smollm2s_setting():
    """`?model=smollm2-135m&setting=stress` and nothing else: every run setting the link leaves out is the stress
    setting's (not the built-in model's defaults, lr 1e-3 on a real model), and the link the page writes back leaves
    them out too while naming what differs from them."""
    from divviz.engine.models import SMOLLM2_SETTINGS

    stress = SMOLLM2_SETTINGS["stress"]
    at = open_page("app_pages/training_lab.py", {"model": "smollm2-135m", "setting": "stress"})
    assert not at.exception and at.sidebar.number_input(key="lab:lr").value == stress["lr"]
    assert at.sidebar.slider(key="lab:minibatches").value == stress["minibatches"]
    assert at.sidebar.selectbox(key="lab:task").value == stress["task"]
    assert "lr" not in at.query_params and "minibatches" not in at.query_params
    at.sidebar.number_input(key="lab:lr").set_value(1e-4).run()
    assert at.query_params["lr"] in (["0.0001"], "0.0001")
    bad = open_page("app_pages/training_lab.py", {"model": "smollm2-135m", "setting": "stress", "lr": "nan"})
    warned = " ".join(shown(w) for w in bad.warning)  # the default the page falls back to is the setting's, named
    assert f"Using the default instead: {stress['lr']:.10g}" in warned
    assert bad.sidebar.number_input(key="lab:lr").value == stress["lr"]


def test_one_page_order_in_the_sidebar_on_home_and_in_readme():
    """The sidebar (router.py), Home's guide and README's table of pages list the pages in `navigation.PAGES`' order."""
    from divviz.app.navigation import PAGES

    titles = [title for _, title, _, _ in PAGES]
    readme = (Path(APP).parent / "README.md").read_text().split("## The pages")[1].split("\n## ")[0]
    assert [line.split("**")[1] for line in readme.splitlines() if line.startswith("| **")] == titles
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    links = [el.proto.label for el in at.get("page_link")]
    assert [link.split(". ", 1)[1] for link in links] == titles[1:]
