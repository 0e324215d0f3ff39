"""Shared fixtures: a real `streamlit run app.py` server on a free localhost port, and Debian's chromium."""

import os

# `./run test` runs the suite in two processes (pytest-xdist, below): each computes on one core, since torch's and
# BLAS's default of a thread per core in both made them fight for the cores (a SmolLM2 step three times slower). A
# test may still ask for more (the float32 golden step's two threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(variable, "1")

import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # where torch was imported before the variable was set

from divviz.app import local_server
from divviz.evidence import bandit_published

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DIVVIZ_POOL_IDLE_S", "5")  # each test's runs folder gets a pool; let idle ones leave soon
os.environ.setdefault("DIVVIZ_POOL_PRIORITY", "normal")  # a pool at the lowest weight starves on a busy machine
# The repository's published runs would join every runs folder a test lists: a test reads them only when it asks
# (the `repository_published` fixture, or a folder of its own through DIVVIZ_PUBLISHED). The published bandit grid
# adds no run: every test's Claims page opens on it, as a fresh clone's does (a copy of it alone).
NO_PUBLISHED_RUNS = None  # the folder this process made (removed when pytest ends); the xdist workers inherit it
if "DIVVIZ_PUBLISHED" not in os.environ:
    NO_PUBLISHED_RUNS = os.environ["DIVVIZ_PUBLISHED"] = tempfile.mkdtemp(prefix="divviz-tests-no-published-runs-")
    shutil.copy(ROOT / "published" / bandit_published.FILE, NO_PUBLISHED_RUNS)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


@pytest.fixture(scope="session")
def app_runs_dir(tmp_path_factory) -> Path:
    """The runs folder of the app that `app_url` serves."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def app_url(tmp_path_factory, app_runs_dir):
    """Start the app as a user would (bound to localhost) and yield its URL."""
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "w")
    server, url = local_server.start({"DIVVIZ_RUNS_DIR": str(app_runs_dir)}, log)
    yield url
    local_server.stop(server)
    log.close()


@pytest.fixture(scope="session")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (./run test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def lm_plan(tmp_path_factory):
    """The built-in LM's claims grid at `lm_grid`'s seeds and steps, queued to a pool and trained once per session
    (tests/evidence/test_claims_lm.py reads it as the claims' cells, tests/runs/test_published.py publishes it)."""
    from divviz.evidence import claims_lm
    from tests.lm_grid import LM_SEEDS, LM_STEPS, wait_until_finished

    plan = claims_lm.LMPlan.read(tmp_path_factory.mktemp("lm_runs"), LM_SEEDS, LM_STEPS)
    assert len(plan.missing) == len(claims_lm.measures()) * LM_SEEDS and not plan.finished
    assert len(plan.queue_missing("a-browser")) == len(plan.missing)
    return wait_until_finished(plan.refreshed())


@pytest.fixture
def repository_published(monkeypatch):
    """The repository's own published runs (published/), as a fresh clone's app and CLI read them."""
    from divviz.runs import published

    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(published.ROOT))
    return published.ROOT


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    """After a test that had a tmp_path: end every process whose command line names it (the pools of its runs
    folders, and their forked runs), whether the test passed or not — a failed test must not leave training behind."""
    where = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if where is None:
        return
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if where in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


# The modules whose tests train runs, start apps or pools, or drive chromium: minutes, not seconds. `./run test --fast`
# leaves them out (the marker `slow`); CI runs everything.
SLOW_MODULES = {"test_browser", "test_claims_lm", "test_claims_real", "test_evidence_tables",
                "test_import_trainers", "test_inspector", "test_lab_pages", "test_published", "test_real_model",
                "test_ray", "test_room", "test_training", "test_trl_minibatch", "test_trl_runs", "test_walkthrough"}


def pytest_unconfigure(config):
    if NO_PUBLISHED_RUNS is not None:  # in the process that made it, after its workers have ended
        shutil.rmtree(NO_PUBLISHED_RUNS, ignore_errors=True)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


# `./run test`'s processes (pytest-xdist) take whole test modules, so that a module's fixtures are made once; the
# modules reading the built-in LM grid (`lm_plan`, trained once per process) go to one process together.
LM_PLAN_MODULES = {"test_claims_lm", "test_published", "test_ray"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "lm_plan" if Path(module).stem in LM_PLAN_MODULES else module

    return ByModule(config, log)
