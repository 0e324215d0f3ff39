"""metrics.jsonl read incrementally (runs/tail.py): appended rows appear without the file being read again, a torn
line waits for its newline, a truncated or replaced file is read again, the cache stays bounded, and whatever
happens to the file, what is read equals a fresh full read of its complete lines."""

import json
import os
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from divviz.runs import store
from divviz.runs.tail import MetricsCache, last_row, parse_row


def row(step: int) -> bytes:
    return (json.dumps({"step": step, "reward": step / 10, "entropy": 1.0}) + "\n").encode()


def full_read(path: Path) -> list[dict]:
    """What a full read gives: every complete (newline-ended) line that is a step's row."""
    data = path.read_bytes()
    return [r for r in (parse_row(line) for line in data[:data.rfind(b"\n") + 1].splitlines()) if r is not None]


def test_appended_rows_are_read_alone(tmp_path):
    path, cache = tmp_path / "metrics.jsonl", MetricsCache()
    path.write_bytes(b"".join(row(s) for s in range(1, 1001)))
    assert [r["step"] for r in cache.rows(path)] == list(range(1, 1001))
    first = cache.bytes_read
    assert first == path.stat().st_size
    assert len(cache.rows(path)) == 1000 and cache.bytes_read == first  # unchanged: nothing read
    with open(path, "ab") as handle:
        handle.write(row(1001))
    assert cache.rows(path)[-1]["step"] == 1001
    assert cache.bytes_read - first <= len(row(1001)) + 64  # the new line (and the few bytes checked before it)


def test_a_torn_line_waits_for_its_newline(tmp_path):
    path, cache = tmp_path / "metrics.jsonl", MetricsCache()
    line = row(2)
    path.write_bytes(row(1) + line[:10])
    assert [r["step"] for r in cache.rows(path)] == [1]
    with open(path, "ab") as handle:
        handle.write(line[10:])
    assert [r["step"] for r in cache.rows(path)] == [1, 2]


def test_a_truncated_or_replaced_file_is_read_again(tmp_path):
    path, cache = tmp_path / "metrics.jsonl", MetricsCache()
    path.write_bytes(row(1) + row(2) + row(3))
    assert len(cache.rows(path)) == 3
    path.write_bytes(row(7))  # truncated (shorter)
    assert [r["step"] for r in cache.rows(path)] == [7]
    other = tmp_path / "new.jsonl"
    other.write_bytes(row(8) + row(9) + row(10) + row(11))
    os.replace(other, path)  # a new file in its place, longer than the old one
    assert [r["step"] for r in cache.rows(path)] == [8, 9, 10, 11]
    path.write_bytes(row(20) + row(21) + row(22) + row(23) + row(24))  # cut and written again, longer, same inode
    assert [r["step"] for r in cache.rows(path)] == [20, 21, 22, 23, 24]


def test_the_cache_is_bounded(tmp_path):
    cache = MetricsCache(max_rows=250)
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"m{i}.jsonl")
        paths[-1].write_bytes(b"".join(row(s) for s in range(100)))
        assert len(cache.rows(paths[-1])) == 100
    assert sum(len(f.rows) for f in cache._files.values()) <= 250 and paths[-1] in cache._files
    assert len(cache.rows(paths[0])) == 100  # forgotten, read again


def test_the_store_and_the_overview_read_through_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(row(1) + row(2) + b"not json\n" + row(3))
    assert [r["step"] for r in store.read_metrics(tmp_path)] == [1, 2, 3]
    assert store.last_metrics(tmp_path)["step"] == 3 and last_row(tmp_path / "missing.jsonl") is None


OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5)),
    st.tuples(st.just("torn"), st.integers(1, 30)),
    st.tuples(st.just("junk"), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, 400)),
    st.tuples(st.just("replace"), st.integers(0, 4)),
    st.tuples(st.just("read"), st.just(0))), max_size=25)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_any_history_reads_as_a_fresh_full_read(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("tail") / "metrics.jsonl"
    path.write_bytes(b"")
    cache, step = MetricsCache(), 0
    for op, n in ops:
        if op == "append":
            with open(path, "ab") as handle:
                for _ in range(n):
                    step += 1
                    handle.write(row(step))
        elif op == "torn":
            step += 1
            with open(path, "ab") as handle:
                handle.write(row(step)[:n])
        elif op == "junk":
            with open(path, "ab") as handle:
                handle.write(b'{"step": "x"}\n')
        elif op == "truncate":
            with open(path, "r+b") as handle:
                handle.truncate(min(n, path.stat().st_size))
        elif op == "replace":
            fresh = path.with_name("fresh.jsonl")
            fresh.write_bytes(b"".join(row(100 + s) for s in range(n)))
            os.replace(fresh, path)
        assert cache.rows(path) == full_read(path)
        assert cache._rows == sum(len(f.rows) for f in cache._files.values())  # the running total is exact


def long_runs(root: Path, runs: int, steps: int, row_of=lambda step, seed: row(step)) -> list[Path]:
    """`runs` finished runs of `steps` metric rows each (`row_of(step, seed)`: a line's bytes), made without training
    (bench/store_scale.py gives its own rows)."""
    from divviz.engine.config import RunConfig
    from divviz.runs.store import RunWriter

    folders = []
    for seed in range(runs):
        folder = root / f"long-{seed}"
        folder.mkdir(parents=True)
        writer = RunWriter(folder, RunConfig.make(steps=steps, seed=seed).to_dict(), steps)
        writer.status["step"] = steps
        writer.finish("done", f"{steps} steps")
        (folder / "metrics.jsonl").write_bytes(b"".join(row_of(s, seed) for s in range(1, steps + 1)))
        folders.append(folder)
    return folders


def test_the_runs_page_overlays_long_runs_thinned_and_exports_them_whole(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    folders = long_runs(tmp_path, 4, 6000)
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/runs.py").run()
    at.multiselect(key="runs:chosen").set_value([f.name for f in folders]).run()
    assert not at.exception, at.exception
    charts = at.get("plotly_chart")
    # thinned: 4 runs × 6,000 steps as base64 float64 would be ≥ 2 × 4 × 6,000 × 8 × 4/3 bytes per panel's x and y
    assert charts and max(len(c.proto.spec) for c in charts) < 2 * 4 * 6000 * 8
    table = at.dataframe[0].value
    assert list(table["step"]) == ["6000/6000"] * 4 and list(table["reward"]) == [600.0] * 4  # each run's last row


def test_what_is_derived_from_a_file_is_kept_until_it_grows(tmp_path):
    path, cache, calls = tmp_path / "metrics.jsonl", MetricsCache(), []
    path.write_bytes(row(1) + row(2))

    def total(rows):
        calls.append(len(rows))
        return sum(r["reward"] for r in rows)

    rows = cache.rows(path)
    assert rows.memo("total", lambda: total(rows)) == rows.memo("total", lambda: total(rows)) and calls == [2]
    again = cache.rows(path)  # unchanged: the same value, not computed again
    assert again.memo("total", lambda: total(again)) == 0.30000000000000004 and calls == [2]
    with open(path, "ab") as handle:
        handle.write(row(3))
    grown = cache.rows(path)
    assert grown.memo("total", lambda: total(grown)) == 0.6000000000000001 and calls == [2, 3]
    path.write_bytes(row(5))  # rewritten: a new entry, nothing derived from the old rows survives
    fresh = cache.rows(path)
    assert fresh.memo("total", lambda: total(fresh)) == 0.5 and calls == [2, 3, 1]
    for k in range(10):  # only the last few keys are kept
        fresh.memo(("key", k), lambda: k)
    assert len(cache._files[path].derived) == 4


def test_a_live_update_computes_and_thins_only_the_run_that_grew(tmp_path, monkeypatch):
    from divviz.views import figures, run_views

    folders = long_runs(tmp_path, 3, 1500)
    computed, thinned = [], []
    real_mean, real_decimate = run_views.trailing_mean, figures.decimate
    monkeypatch.setattr(run_views, "trailing_mean", lambda values, w: computed.append(len(values)) or
                        real_mean(values, w))
    monkeypatch.setattr(figures, "decimate", lambda *s, **k: thinned.append(len(s[0])) or real_decimate(*s, **k))
    charts = lambda: run_views.training_charts([(f.name, store.read_metrics(f)) for f in folders])  # noqa: E731
    first = charts()
    assert set(computed) == {1500} and set(thinned) == {1500}
    computed.clear(), thinned.clear()
    with open(folders[0] / "metrics.jsonl", "ab") as handle:
        handle.write(row(1501))
    second = charts()
    per_run = len(computed)  # each curve of the grown run, and only those
    assert per_run > 0 and set(computed) == {1501} and set(thinned) == {1501}
    assert len(thinned) == len([1 for chart in second.values() for t in chart.figure._spec["data"]
                                if t.get("name", "").startswith(folders[0].name)])
    scratch = run_views.training_charts([(f.name, [dict(r) for r in store.read_metrics(f)]) for f in folders])
    for name, chart in second.items():  # what was kept equals what is computed from plain rows, every point
        for kept, fresh in zip(chart.export._spec["data"], scratch[name].export._spec["data"], strict=True):
            np.testing.assert_array_equal(kept["y"], fresh["y"])
    assert first.keys() == second.keys()


def test_status_and_config_are_read_once_per_change(tmp_path, monkeypatch):
    from divviz.engine.config import RunConfig
    from divviz.runs.store import RunWriter

    folder = tmp_path / "run"
    folder.mkdir()
    writer = RunWriter(folder, RunConfig.make(steps=3).to_dict(), 3)
    read = []
    real = store.open_regular
    monkeypatch.setattr(store, "open_regular", lambda path: read.append(path.name) or real(path))
    first = store.read_run(folder)
    assert sorted(read) == ["config.json", "status.json"] and first.state == "running"
    first.config["task"] = "changed by a caller"  # its own value: what is kept is what the file holds
    second = store.read_run(folder)
    assert len(read) == 2 and second.config["task"] != "changed by a caller"
    writer.status["step"] = 2
    writer.finish("done", "2 steps")  # status.json replaced
    third = store.read_run(folder)
    assert read[2:] == ["status.json"] and third.state == "done" and third.step == 2
    (folder / "config.json").write_text("[1, 2]")  # rewritten in place: read again, and refused
    assert store.read_run(folder).state == "corrupt" and read[3:] == ["config.json"]


def test_a_folder_of_hundreds_of_runs_is_paged_and_filtered(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from divviz.views.runs_table import PAGE_SIZE

    long_runs(tmp_path, 120, 3)
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) == PAGE_SIZE and "120 of 120 runs" in at.caption[0].value
    at.number_input(key="runs:page").set_value(3).run()
    assert len(at.dataframe[0].value) == 120 - 2 * PAGE_SIZE
    at.text_input(key="runs:filter").set_value("LONG-11").run()  # case aside: long-11 and long-110 … long-119
    assert sorted(at.dataframe[0].value["run"]) == sorted(["long-11", *(f"long-11{k}" for k in range(10))])
    assert not at.exception and not [n for n in at.number_input if n.key == "runs:page"]  # one page: no pager
