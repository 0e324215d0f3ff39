"""Each page under streamlit's AppTest: runs clean, draws its charts, reacts to a control, and restores
its controls from a shared link."""

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from divviz.safetext import WORD_JOINER

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def shown(element) -> str:
    """The text a message shows: its Markdown source with the escapes of `safetext.literal` taken out."""
    return re.sub(r"\\(.)", r"\1", element.value).replace(WORD_JOINER, "")


def open_page(page: str | None = None, query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if query:
        at.query_params.update(query)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def specs(at) -> list[str]:
    return [chart.proto.spec for chart in at.get("plotly_chart")]


def slider(at, label):
    return next(s for s in at.slider if s.label == label)


def test_home_page():
    at = open_page()
    assert at.title[0].value == "divviz"
    assert len(specs(at)) == 1


def test_catalogue_page_lists_every_measure():
    at = open_page("app_pages/catalogue.py")
    text = " ".join(m.value for m in at.markdown)
    for name in ("ratio", "clip_higher", "kl3", "prob_tv", "prob_l2", "mirror", "urkl_rf"):
        assert f"`{name}`" in text


def test_clipping_regions_page_reacts_and_shares():
    at = open_page("app_pages/clipping_regions.py")
    before = specs(at)
    assert len(before) == 5
    slider(at, "delta").set_value(0.1).run()
    assert not at.exception
    after = specs(at)
    assert all(a != b for a, b in zip(before, after))  # every figure followed δ
    assert at.query_params["kl3.delta"] == "0.1"
    # choose other tests; the URL follows
    at.multiselect[0].set_value(["kl2", "prob_tv"]).run()
    assert not at.exception and at.query_params["m"] == "kl2,prob_tv"
    assert json.loads(specs(at)[0])["data"][0]["name"].startswith("kl2")


def test_clipping_regions_link_restores_controls():
    at = open_page("app_pages/clipping_regions.py", {"m": "ratio,kl3", "kl3.delta": "0.02", "dual": "1", "c": "2"})
    assert at.multiselect[0].value == ["ratio", "kl3"]
    assert slider(at, "delta").value == pytest.approx(0.02)
    assert slider(at, "dual-clip c").value == pytest.approx(2.0)
    assert "[0.8131, 1.2135]" in specs(at)[0]  # the interval chart shows δ = 0.02's interval


def test_bad_link_values_warn_and_fall_back():
    at = open_page("app_pages/clipping_regions.py", {"kl3.delta": "nan", "m": "ratio,bogus"})
    warnings = " ".join(shown(w) for w in at.warning)
    assert "'delta' must be a finite number" in warnings and "unknown value 'bogus'" in warnings
    assert slider(at, "delta").value == pytest.approx(0.05)
    assert len(specs(at)) == 5


def test_clipping_regions_preset_and_empty_selection():
    at = open_page("app_pages/clipping_regions.py")
    next(b for b in at.button if b.label.startswith("KL1 vs KL2")).click().run()
    assert at.multiselect[0].value == ["kl1", "kl2", "kl3"]
    at.multiselect[0].set_value([]).run()
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


def test_mass_reallocation_page():
    at = open_page("app_pages/mass_reallocation.py", {"iterations": "20", "k": "20"})
    assert len(specs(at)) == 4 and len(at.metric) == 3
    before = specs(at)
    slider(at, "delta").set_value(0.2).run()
    assert not at.exception and specs(at) != before
    # an impossible combination is a message in the page, not a traceback
    slider(at, "correct_rank").set_value(30).run()
    assert not at.exception and "'correct_rank' must be below k = 20" in shown(at.error[0])
