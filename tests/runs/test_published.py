"""The published runs (`runs/published.py`): a grid published run by run, compact and readable with gzip and
json alone, opened as a runs folder — holding every cell a user's folder lacks, listed read-only on the Runs page,
opened by the Step inspector — a broken manifest hiding only its own grid, and a published run trained again from its
config.json coming back to the bit (`scripts/retrain_published.py`)."""

import gzip
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from divviz.evidence import claims, claims_lm, lm_evidence
from divviz.evidence.lm_evidence import LMEvidence
from divviz.runs import published, store
from tests.lm_grid import LM_SEEDS, LM_STEPS

ROOT = Path(__file__).resolve().parents[2]
TRAINED_BY = {"model": "builtin", "setting": "", "device": "cpu", "cpu": "AVX512 avx512_bf16 amx_bf16 amx_tile",
              "precision": "float32", "torch": "t", "transformers": "x", "python": "3", "commit": "abc1234",
              "seeds": LM_SEEDS, "pilot_seeds": LM_SEEDS}


@pytest.fixture
def published_grid(lm_plan, tmp_path, monkeypatch):
    """The fixture's grid published (`runs/published.py`) into a folder of its own, read as divviz reads
    published/ (its unpacked copy in a cache of this test's)."""
    where = tmp_path / "published"
    for (measure, reward, seed), run in lm_plan.runs.items():
        published.publish(run.folder, where / "builtin-grid", {"measure": measure, "reward": reward, "seed": seed},
                          TRAINED_BY)
    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(where))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return where / "builtin-grid"


def test_published_runs_hold_every_cell_a_runs_folder_lacks(lm_plan, published_grid, tmp_path):
    empty = tmp_path / "mine"
    plan = claims_lm.LMPlan.read(empty, LM_SEEDS, LM_STEPS)
    assert plan.finished and not plan.missing and all(plan.is_published(run) for run in plan.runs.values())
    assert "0 are your own" in plan.provenance and "builtin-grid" in plan.provenance and "commit abc1234" in plan.provenance
    assert "kernels differ" not in plan.provenance  # one grid, one CPU
    keys = ("condition", "candidate", "metric", "mean", "low", "high", "n", "p", "verdict")
    assert ([{k: r[k] for k in keys} for r in LMEvidence(plan).rows()]
            == [{k: r[k] for k in keys} for r in LMEvidence(lm_plan).rows()])  # the same cells as the runs trained
    alone = claims_lm.LMPlan.read(empty, LM_SEEDS, LM_STEPS, with_published=False)
    assert not alone.done and alone.provenance == ""
    mine = lm_plan.runs[(claims.PPO, "task", 0)]  # a run of the user's own of a published cell: it holds the cell
    shutil.copytree(mine.folder, empty / mine.name)
    plan = claims_lm.LMPlan.read(empty, LM_SEEDS, LM_STEPS)
    assert not plan.is_published(plan.runs[(claims.PPO, "task", 0)]) and "1 are your own" in plan.provenance


def test_runs_of_a_cell_on_two_kinds_of_device_are_two_grids_never_one(lm_plan, published_grid, tmp_path):
    """A GPU's run of a cell (its status says cuda) published beside the CPU's: a plan reads the kind it is asked
    for, the CPU's grid by default, and never fills one kind's cells with the other's."""
    cell = (claims.PPO, "task", 0)
    gpu_run = tmp_path / "trained on a GPU" / f"gpu-{lm_plan.runs[cell].name}"  # run names are unique across grids
    shutil.copytree(lm_plan.runs[cell].folder, gpu_run)
    store.write_status(gpu_run, {**store.read_status(gpu_run), "device": "cuda:0"})
    published.publish(gpu_run, published_grid.parent / "builtin-gpu", {"measure": cell[0], "reward": "task", "seed": 0},
                      {**TRAINED_BY, "device": "cuda:0"})
    empty = tmp_path / "mine"
    on_cpu = claims_lm.LMPlan.read(empty, LM_SEEDS, LM_STEPS)
    on_gpu = claims_lm.LMPlan.read(empty, LM_SEEDS, LM_STEPS, device="cuda")
    assert on_cpu.finished and all(claims_lm.device_kind(run) == "cpu" for run in on_cpu.runs.values())
    assert on_gpu.done == 1 and claims_lm.device_kind(on_gpu.runs[cell]) == "cuda"
    assert "builtin-gpu (1 runs, trained on cuda:0" in on_gpu.provenance and "builtin-gpu" not in on_cpu.provenance
    assert on_gpu.name == on_cpu.name  # the built-in LM has no GPU grid declared: the same cells, another device


def test_a_grid_finished_on_a_cpu_with_other_kernels_is_read_with_the_first_and_named(lm_plan, published_grid):
    """A grid's last runs trained on a CPU whose kernels are not the first grid's (no AMX: bf16 rounds otherwise)
    are a grid of their own, whose manifest names those kernels: the plan reads both, and its provenance names each
    grid's kernels and says that a pair across them shares neither its first completions nor its step-0 evaluation."""
    cell = (claims.DAPO, "task", LM_SEEDS - 1)
    name = lm_plan.runs[cell].name
    shutil.rmtree(published_grid / name)
    manifest = json.loads((published_grid / "manifest.json").read_text())
    del manifest["runs"][name]
    (published_grid / "manifest.json").write_text(json.dumps(manifest))
    published.publish(lm_plan.runs[cell].folder, published_grid.parent / "builtin-grid-2",
                      {"measure": cell[0], "reward": "task", "seed": cell[2]},
                      {**TRAINED_BY, "cpu": "AVX512 avx512_bf16"})
    plan = claims_lm.LMPlan.read(published_grid.parent / "mine", LM_SEEDS, LM_STEPS)
    assert plan.finished and all(plan.is_published(run) for run in plan.runs.values())
    assert f"builtin-grid ({len(plan.runs) - 1} runs, trained on cpu (AVX512 avx512_bf16 amx_bf16 amx_tile)" \
        in plan.provenance
    assert "builtin-grid-2 (1 runs, trained on cpu (AVX512 avx512_bf16) in float32" in plan.provenance
    assert plan.provenance.endswith("the CPUs' kernels differ, so a pair's two runs across these grids are the same "
                                    "design, not the same bits: they share neither their first completions nor their "
                                    f"step-0 evaluation; 0 are your own (runs folder {published_grid.parent / 'mine'})")


def test_a_published_run_is_compact_and_read_with_gzip_and_json_alone(lm_plan, published_grid):
    manifest = json.loads((published_grid / "manifest.json").read_text())
    run = lm_plan.runs[(claims.KL3_WIDE, "task", 1)]
    entry = manifest["runs"][run.name]
    assert (entry["measure"], entry["seed"], entry["state"], manifest["commit"]) == (claims.KL3_WIDE, 1, "done",
                                                                                    "abc1234")
    folder = published_grid / run.name
    assert not (folder / "metrics.jsonl").exists() and not (folder / "resume.pt").exists()
    rows = [json.loads(line) for line in gzip.decompress((folder / "metrics.jsonl.gz").read_bytes()).splitlines()]
    assert rows == [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    assert entry["steps_s"] == round(sum(row["step_time"] for row in rows), 1) > 0  # a resume does not reset it
    assert manifest["steps_s"] == round(sum(r["steps_s"] for r in manifest["runs"].values()), 1)
    assert sorted(p.name for p in (folder / "tokens").iterdir()) == [f"step_{s:06d}.npz"
                                                                    for s in published.kept_steps(LM_STEPS)]
    for name, digest in entry["sha256"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    with pytest.raises(ValueError, match="not trained as"):  # one grid, one way of training
        published.publish(run.folder, published_grid, {"measure": "x", "reward": "task", "seed": 0},
                          {**TRAINED_BY, "commit": "other"})


def test_a_broken_manifest_hides_its_grid_and_nothing_else(published_grid, tmp_path):
    (published_grid.parent / "broken").mkdir()
    (published_grid.parent / "broken" / "manifest.json").write_text("{not json")
    (published_grid.parent / "odd").mkdir()
    (published_grid.parent / "odd" / "manifest.json").write_text(json.dumps({"runs": {"../../escape": {}}}))
    assert list(published.manifests()) == ["builtin-grid"]
    assert len(store.list_runs(published.folder())) == len(json.loads((published_grid / "manifest.json").read_text())
                                                            ["runs"])


def test_the_runs_page_and_the_step_inspector_list_published_runs_read_only(lm_plan, published_grid, tmp_path,
                                                                            monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "mine"))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app_pages" / "runs.py"), default_timeout=120)
    at.run()
    assert not at.exception
    table = at.dataframe[0].value
    assert len(table) == len(lm_plan.runs) and set(table.owner) == {"published: builtin-grid"}
    assert set(table.source) == {"published: trained by commit abc1234"}  # not "trained here"
    measures = {measure for measure, _, _ in lm_plan.runs}  # each run under its claims name, beside its label
    assert set(table["claims measure"]) == measures and claims.BOX_LOW_ONLY in measures
    assert at.dataframe[0].proto.placeholder == "—"  # a missing value is a dash, not a grey "None"
    assert at.selectbox(key="runs:delete").options == []  # nothing published can be stopped or deleted
    assert "one user" in at.markdown[0].value  # a local app: any browser manages any run, and says so
    at.text_input(key="runs:filter").set_value("builtin-grid cpu").run()  # a published grid's name and a device
    assert len(at.dataframe[0].value) == len(lm_plan.runs)
    at.text_input(key="runs:filter").set_value("cuda").run()
    assert not at.exception and f"0 of {len(lm_plan.runs)} runs" in at.caption[0].value


def test_the_step_inspector_opens_a_published_run_at_its_last_kept_step(lm_plan, published_grid, tmp_path,
                                                                        monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "mine"))
    run = lm_plan.runs[(claims.KL3_WIDE, "task", 0)]
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app_pages" / "step_inspector.py"),
                           default_timeout=120)
    at.session_state["inspector:run"] = run.name
    at.run()
    assert not at.exception and at.selectbox(key="inspector:run").value == run.name
    kept = store.completion_steps(published.folder() / run.name)
    assert kept and set(kept) <= set(published.kept_steps(LM_STEPS)) and at.subheader[0].value.endswith(
        f"step {kept[-1]}")


def test_divviz_rescore_reads_a_published_run_by_its_place_or_its_name(lm_plan, published_grid, tmp_path, capsys):
    """The Step inspector says `divviz rescore` prints the same: given published/<grid>/<run> (whose records are
    compressed) or the run's name, it re-scores the run as it was trained."""
    from divviz.cli import main

    run = lm_plan.runs[(claims.KL3_WIDE, "task", 0)]
    step = store.completion_steps(run.folder)[-1]
    assert main(["rescore", str(run.folder), "--step", str(step), "--clip-test", "ratio", "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    for given in (str(published_grid / run.name), run.name):
        assert main(["rescore", given, "--step", str(step), "--clip-test", "ratio", "--json",
                     "--runs-dir", str(tmp_path / "mine")]) == 0
        assert json.loads(capsys.readouterr().out) == trained


def test_a_published_run_trained_again_is_the_same_run_and_a_change_is_named(lm_plan, published_grid, tmp_path,
                                                                            capsys):
    spec = importlib.util.spec_from_file_location("retrain", ROOT / "scripts" / "retrain_published.py")
    retrain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(retrain)
    run = published_grid / lm_plan.runs[(claims.KL3_WIDE, "task", 1)].name
    threads = torch.get_num_threads()
    try:
        assert retrain.main([str(run), "--runs-dir", str(tmp_path / "again"), "--this-checkout"]) == 0  # (abc1234)
    finally:
        torch.set_num_threads(threads)
    assert f"{run.name}: the same run, to the bit" in capsys.readouterr().out
    again = next(p for p in (tmp_path / "again").iterdir() if p.is_dir())
    assert published.differences(run, again) == []
    rows = (again / "metrics.jsonl").read_text().splitlines()
    rows[1] = json.dumps({**json.loads(rows[1]), "loss": 1.0, "step_time": 99.0})
    (again / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    kept = sorted((again / "tokens").iterdir())[-1]
    kept.unlink()
    assert published.differences(run, again) == ["metrics.jsonl: step 2 differs", f"tokens/{kept.name} differs"]
    assert retrain.main([str(tmp_path / "again" / again.name)]) == 2
    assert "not a run of a published grid" in capsys.readouterr().out
    original = (run / "config.json").read_text()
    (run / "config.json").write_text('{"clip": "no such test"}')  # not the file the manifest's SHA-256 names
    assert retrain.main([str(run)]) == 2
    assert "its grid is damaged" in capsys.readouterr().out and "config.json: its SHA-256" in published.damaged(
        published_grid.parent)["builtin-grid"]
    (run / "config.json").write_text(original)
    (published_grid / "manifest.json").touch()  # a grid is checked again when its manifest changes
    assert retrain.main([str(run)]) == 2  # the manifest's commit, abc1234, is not in this repository: one line
    assert "is not in this repository; --this-checkout trains it with today's code" in capsys.readouterr().out


def test_a_published_run_is_trained_again_by_the_commit_its_manifest_names(capsys):
    """The built-in LM's grid names 55ed05a: that commit's code, checked out in a worktree, trains its seed-0 KL3
    run again to the bit where this CPU's kernels are the grid's (about 20 s), and says it differs, after a note
    that the kernels differ, where they are not (an AVX2-only CPU); a commit the repository lacks is one line."""
    spec = importlib.util.spec_from_file_location("retrain", ROOT / "scripts" / "retrain_published.py")
    retrain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(retrain)
    grid = published.ROOT / "builtin-cpu"
    manifest = json.loads((grid / "manifest.json").read_text())
    run = grid / min((cell["seed"], name) for name, cell in manifest["runs"].items()
                     if cell["measure"] == claims.KL3_WIDE and cell["reward"] == "task")[1]
    if manifest.get("cpu") == published.cpu_kernels():
        assert retrain.main([str(run)]) == 0
        assert f"the same run, to the bit (trained again by commit {manifest['commit']}" in capsys.readouterr().out
    else:  # other kernels round otherwise: the script says so first, and that the run it trained again differs
        assert retrain.main([str(run)]) == 1
        said = capsys.readouterr().out
        assert said.startswith(f"note: this CPU's kernels ({published.cpu_kernels()}) are not the grid's")
        assert f"differs (trained again by commit {manifest['commit']}" in said
    with pytest.raises(LookupError):
        retrain.train_at_commit("0" * 40, run / "config.json", ROOT)


def test_a_lease_stops_starting_runs_that_would_not_finish_in_it():
    """`scripts/train_declared.py` (a grid trained within a lent GPU's call): the queue stops once a run started now
    would end after the call's end at the slowest finished run's pace, and never before one has finished."""
    spec = importlib.util.spec_from_file_location("train_declared", ROOT / "scripts" / "train_declared.py")
    train_declared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_declared)

    def run(state: str, seconds: float) -> store.RunInfo:
        return store.RunInfo(Path(state), state, "", 30, 30, {}, {"started": 1000.0, "updated": 1000.0 + seconds})

    late = train_declared.too_late_to_start
    assert not late([run("running", 500.0), run("queued", 0.0)], elapsed=400.0, until=450.0)  # no pace known yet
    finished = [run("done", 190.0), run("done", 200.0), run("running", 100.0)]
    assert not late(finished, elapsed=240.0, until=450.0)  # 240 + 200 ≤ 450: a run started now ends in time
    assert late(finished, elapsed=260.0, until=450.0)  # 260 + 200 > 450


def test_a_later_lease_trains_only_the_cells_no_published_grid_holds(tmp_path, repository_published):
    """A lease queues the declared grid's cells that no published grid holds. The GPU pair's first lease published
    seeds 0–15 (published/smollm2-135m-stress-h200) and the pair was closed there (`claims_lm.CLOSED_AT`): a bare
    machine's next lease, carrying the checkout, queues nothing, and the pilot's sentence says why its n is 16 of 43.
    On a CPU's learn grid it queues exactly the cells with no published run."""
    spec = importlib.util.spec_from_file_location("train_declared", ROOT / "scripts" / "train_declared.py")
    train_declared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_declared)
    plan = train_declared.lease_plan(tmp_path, "smollm2-135m", "stress", "cuda")
    published_seeds = {seed for (_, _, seed), run in plan.runs.items() if plan.is_published(run)}
    assert published_seeds == set(range(16)) and len(plan.runs) == 32 and not plan.missing
    assert "Declared: the pair alone on 43 seeds" in lm_evidence.pilot_text(LMEvidence(plan).pilot())
    assert "closed at 16 when no device was lent" in lm_evidence.pilot_text(LMEvidence(plan).pilot())
    learn = train_declared.lease_plan(tmp_path, "smollm2-135m", "learn", "cpu")
    assert learn.missing == [key for key, run in learn.runs.items() if not learn.is_published(run)]
