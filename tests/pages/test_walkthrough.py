"""README's workshop walkthrough is what a newcomer sees: README holds exactly what the Tour page's source writes,
every step's link opens its page without a refused value, and every number the walkthrough quotes is on the page
its step names, where it says (a metric, a chart, a cell of the page's table)."""

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from divviz.views import tour

ROOT = Path(__file__).resolve().parents[2]


def opened(page: str, query: dict) -> AppTest:
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300)
    at.query_params.update(query)
    at.run()
    at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not any("default instead" in w.value or "refused" in w.value for w in at.warning), \
        [w.value for w in at.warning]
    return at


def test_readme_holds_the_walkthrough_the_tour_writes():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- walkthrough: made by scripts/walkthrough.py -->\n")[1].split("<!-- walkthrough end -->")[0]
    assert block == tour.markdown(), "README's walkthrough is stale: run python scripts/walkthrough.py"


@pytest.mark.parametrize("step", tour.STEPS, ids=[s.title for s in tour.STEPS])
def test_each_steps_link_opens_its_view(step):
    link = urlsplit(step.link())
    at = opened(link.path.strip("/"), dict(parse_qsl(link.query)))
    assert not at.error, [e.value for e in at.error]
    assert "{" not in step.text()  # every field of its text is filled


NUMBERS = [(step.title, name, number) for step in tour.STEPS for name, number in step.numbers().items()]


@pytest.mark.parametrize("title,name,number", NUMBERS, ids=[f"{t}:{n}" for t, n, _ in NUMBERS])
def test_each_quoted_number_is_where_the_step_says(title, name, number):
    at = opened(number.page, number.query)
    kind, where = number.where
    if kind == "metric":
        assert next(m for m in at.metric if m.label == where).value == number.text
    elif kind == "chart":
        assert any(number.text in chart.proto.spec for chart in at.get("plotly_chart")), number.text
    else:
        measure, metric, column = where.split("|")
        table = at.dataframe[0].value
        value = table[(table["measure"] == measure) & (table["metric"] == metric)].iloc[0][column]
        if isinstance(value, str):
            assert value == number.text
        else:
            digits = len(re.sub(r".*\.", "", number.text))
            assert f"{value:.{digits}f}" == number.text.lstrip("+") or f"{value:+.{digits}f}" == number.text


def test_the_tour_page_shows_every_step_with_its_numbers():
    at = opened("tour", {})
    assert [h.value for h in at.subheader] == [f"{n}. {s.title}" for n, s in enumerate(tour.STEPS, 1)]
    shown = " ".join(m.value for m in at.markdown)
    assert all(number.text in shown for _, _, number in NUMBERS)
    assert all(step.link().lstrip("/") in shown for step in tour.STEPS)
