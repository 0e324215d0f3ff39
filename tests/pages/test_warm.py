"""The server's warm-up (divviz/app/warm.py): it computes what the Claims page opens on, so the page's first run
computes none of it again, and a real server started as a user starts it says on its log that it warmed."""

import tempfile
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from divviz.app import local_server, warm
from divviz.evidence import claims_real, claims_report, lm_evidence
from divviz.evidence.kept import Kept

ROUTER = str(Path(__file__).resolve().parents[2] / "router.py")


def test_the_warm_up_computes_every_cell_the_claims_page_opens_on(tmp_path, monkeypatch, repository_published):
    """As a fresh clone opens it: the published SmolLM2 runs and one-update batches."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    for module in (claims_report, lm_evidence, claims_real):
        monkeypatch.setattr(module, "COMPUTED", Kept())
    warm.DONE.clear()
    warm.warm()
    assert warm.DONE.is_set()
    warmed = {module: module.COMPUTED.computed for module in (claims_report, lm_evidence, claims_real)}
    assert all(warmed.values())  # the report, the published SmolLM2 runs' cells, curves, collapses, pilot; the
    # one-update cells
    at = AppTest.from_file(ROUTER, default_timeout=300).run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception
    assert {module: module.COMPUTED.computed for module in warmed} == warmed  # the page found every one computed


def test_a_warm_up_that_fails_says_so_in_one_line_and_lets_the_pages_compute(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("the runs folder is gone")

    monkeypatch.setattr(claims_report, "COMPUTED", Kept())  # the report it builds before failing stays in this test
    monkeypatch.setattr("divviz.evidence.claims_lm.opening_plan", broken)
    warm.DONE.clear()
    warm.warm()
    err = capsys.readouterr().err
    assert warm.DONE.is_set() and err.count("\n") == 1
    assert err.startswith("divviz: the warm-up stopped (OSError: the runs folder is gone)")


@pytest.mark.slow
def test_the_server_answers_at_once_and_warms_itself_behind_it(tmp_path):
    """`streamlit run app.py` serves router.py under uvicorn (`st.App`); its health endpoint answers before the warm-up
    ends, and the warm-up's line comes once it has."""
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        server, url = local_server.start({"DIVVIZ_RUNS_DIR": tempfile.mkdtemp(dir=tmp_path)}, log=log)
        try:
            deadline = time.time() + 600  # a bound on a failure only: the line is the event waited for
            while "divviz: warm" not in log_path.read_text() and time.time() < deadline and server.poll() is None:
                time.sleep(0.2)
        finally:
            local_server.stop(server)
    assert "divviz: warmed in" in log_path.read_text(), log_path.read_text()[-2000:]
