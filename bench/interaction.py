"""How long a control change takes end to end in a real browser: Debian's chromium, driven by Playwright, against
`streamlit run app.py` on a free 127.0.0.1 port with a runs folder of its own (two short runs of the built-in model,
trained here first, for the Runs page and the Step inspector), or one given with --runs (a claims grid's: the Claims
page then draws its cells over training, its learning curves and forest plots).

Measured, each N times (`--repeat`, default 5), alternating between two values so that every change is a real one:
  - on each page, typical controls: Clipping regions (a clip test's ε, dual-clip), KL3 (δ), Mass reallocation (the
    initial distribution, the paired differences' metric), Claims (the language-model select, SmolLM2's Setting, the
    claim shown, and the Setting again with the claim over training shown: no training starts),
    Training lab (the model select, and SmolLM2's Setting select; never Start), Runs (the filter, "Group by
    measure"), Step inspector (each of its selects: run, step, colouring, completion, token), Catalogue (a tab);
    Home and Tour have no control of their own;
  - page loads: the page's URL opened in the same tab (a new Streamlit session; the browser's cache of the
    frontend warm), after one first load of each page that is reported on its own (what a fresh server's warm-up,
    `divviz/app/warm.py`, left to do; the bench waits for the warm-up's line on the server's log first, or, with
    --at-start, loads the first page the moment the server answers).
Since the values alternate, a page's own caches (st.cache_data, the bandit's runs) may hold both after the first two
changes: the max is then the first, uncached change.

End to end, timed by the page's own clock (performance.now()):
  start — the timeStamp of the input event that makes the change (the pointerdown on a select's option, a tab or a
    toggle; the keydown of an arrow key on a focused slider, of Enter in a text box), caught by a capture listener
    armed just before; for a page load, the navigation's start (0);
  end — the first animation frame at which (1) the server's `script_finished` message for a run that started after
    the input has arrived (read off the websocket by a wrapper installed before the app's scripts: the top-level
    field 6 of a ForwardMsg; a full run must finish as FINISHED_SUCCESSFULLY, a control inside a fragment as
    FINISHED_FRAGMENT_RUN_SUCCESSFULLY — then a text that depends on the new value is awaited as well, since the
    Runs page's table refreshes itself every 2 s), (2) the app's `data-test-script-state` is back to notRunning
    after that message (or two frames have passed since it, should React have skipped drawing "running"), (3) every
    Plotly chart on the page has drawn its SVG, and (4) where given, an element that depends on the new value is
    there. A tab switch does not rerun the script: it ends at (3) and (4).
So the time covers the browser sending the change, the server's rerun, the messages back and the frontend drawing
them (to within a frame, 16 ms). Playwright's own calls are outside it.

Target: a control change on any page ≤ 1 s end to end in chromium on this 2-core machine while
nothing trains. Prints a table per control (median and max over N, within 1 s or not) and one of page loads.

    python bench/interaction.py [--repeat 5] [--pages step_inspector runs …] [--runs DIR] [--json PATH]
                                [--timeout 1800] [--at-start]
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chromium_rerun import FINISHED, FRAGMENT_FINISHED, INSTRUMENT, Driver, OutOfTime  # noqa: E402
from divviz.app import local_server  # noqa: E402

BUDGET_S = 1.0
CLAIM_PAIR = ("The KL3 test equals", "KL3 makes GRPO training")  # the Claims page's first claim; the one over training
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
PAGES = {"home": ("", "Home"), "tour": ("tour", "Tour"), "clipping_regions": ("clipping_regions", "Clipping regions"),
         "kl3_equivalence": ("kl3_equivalence", "KL3 ⇔ asymmetric clipping"),
         "mass_reallocation": ("mass_reallocation", "Mass reallocation"), "claims": ("claims", "Claims"),
         "training_lab": ("training_lab", "Training lab"), "runs": ("runs", "Runs"),
         "step_inspector": ("step_inspector", "Step inspector"), "catalogue": ("catalogue", "Catalogue")}
# name → (URL path, title), in app.py's order
class Measured:
    """One row: a control's changes, a page's loads or its first load, in seconds."""

    def __init__(self, page: str, what: str, kind: str = "change"):
        self.page, self.what, self.kind, self.seconds, self.error = page, what, kind, [], None

    def row(self) -> dict:
        s = self.seconds
        return {"page": self.page, "what": self.what, "kind": self.kind, "seconds": [round(x, 3) for x in s],
                "median_s": round(statistics.median(s), 3) if s else None, "max_s": round(max(s), 3) if s else None,
                "within_budget": max(s) <= BUDGET_S if s and self.kind == "change" else None, "error": self.error}


def controls(d: Driver) -> dict[str, list]:
    """Per page: (control, change(rep) → seconds, setup or None); the setup runs once, untimed, before the first
    change. `rep` alternates the two values."""
    sb = d.sidebar
    right_left, left_right = ("ArrowRight", "ArrowLeft"), ("ArrowLeft", "ArrowRight")
    tabs = (("Surrogates", "Sequence level (GSPO)"), ("Clip tests", "Dual-clip cap"))  # a tab, a text in its panel
    return {
        "clipping_regions": [
            ("ratio's ε (slider, one step)", lambda r: d.slider("eps", right_left, r, where=sb()), None),
            ("Dual-clip for A < 0 (toggle)", lambda r: d.toggle("Dual-clip for A < 0", where=sb()), None)],
        "kl3_equivalence": [
            ("KL3 level δ (slider, one step)", lambda r: d.slider("KL3 level δ", right_left, r, where=sb()), None)],
        "mass_reallocation": [
            ("Initial distribution π_0 (zipf ↔ uniform)",
             lambda r: d.select("Initial distribution π_0", ("zipf", "uniform"), where=sb()), None),
            ("paired differences' metric (select)", lambda r: d.select("Metric over the iterations", (0, 1)), None)],
        "claims": [
            ("language model (builtin ↔ SmolLM2)", lambda r: d.select("Model", (0, 1)), None),
            ("SmolLM2's Setting (learn ↔ stress)", lambda r: d.select("Setting", ("learn", "stress")),
             lambda: d.select("Model", (1,))),  # with --runs a claims grid: its cells, curves and forest plots
            ("Claim (KL3 = clipping ↔ KL3 over training)", lambda r: d.select("Claim", CLAIM_PAIR), None),
            ("SmolLM2's Setting, KL3 over training shown", lambda r: d.select("Setting", ("learn", "stress")),
             lambda: d.select("Claim", CLAIM_PAIR[1:]))],
        "training_lab": [
            ("Model (builtin ↔ SmolLM2)", lambda r: d.select("Model", (0, 1), where=sb()), None),
            ("SmolLM2's Setting (learn ↔ look only)",
             lambda r: d.select("Setting", ("learn", "look only"), where=sb()),
             lambda: d.select("Model", (1,), where=sb()))],  # the Setting select shows for SmolLM2
        "runs": [
            ("Filter runs (kl3 ↔ empty; a fragment)",
             lambda r: d.text("Filter runs", ("kl3", "")[r % 2], accept=(FRAGMENT_FINISHED, FINISHED),
                              text=("1 of 2 runs", "2 of 2 runs")[r % 2]), None),
            ("Group by measure (toggle)", lambda r: d.toggle("Group by measure"), None)],
        "step_inspector": [
            ("Run (select)", lambda r: d.select("Run", (0, 1), where=sb()), None),
            ("Step (select slider, one step)", lambda r: d.slider("Step", left_right, r, where=sb()), None),
            ("Colour tokens by (ratio ↔ clip state)",
             lambda r: d.select("Colour tokens by", ("ratio", "clip state"), where=sb()), None),
            ("Completion (select)", lambda r: d.select("Completion", (0, 1)), None),
            ("Token (select)", lambda r: d.select("Token", (0, 1)), None)],
        "catalogue": [
            ("a tab (Surrogates ↔ Clip tests; no rerun)", lambda r: d.tab(*tabs[r % 2]), None)],
    }


def said(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def make_runs(root: Path) -> list[str]:
    """Two short runs of the built-in model (kl3, ratio), 3 steps each with their completions kept."""
    from divviz.engine.config import RunConfig
    from divviz.runs.train import train

    folders = [train(RunConfig.make(steps=3, prompts=2, group_size=4, clip=clip, lr=0.05, max_new_tokens=6), root)
               for clip in ("kl3", "ratio")]
    return [f.name for f in folders]


def wait_for_warm_up(log_path: Path, timeout_s: float) -> float:
    """Seconds until the server's log says its warm-up ended (`divviz/app/warm.py`), as a user opening the app a
    few seconds after starting it finds it."""
    start = time.time()
    while time.time() < start + timeout_s:  # the log line is the event; the timeout bounds a failure only
        if "divviz: warm" in log_path.read_text():
            return time.time() - start
        time.sleep(0.1)
    raise OutOfTime(f"the server did not end its warm-up within {timeout_s:g} s")


def measure(args, url: str) -> list[Measured]:
    rows: list[Measured] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_init_script(INSTRUMENT)
            d = Driver(context.new_page(), url, args.step_timeout)
            table = controls(d)
            for name in args.pages:
                path, title = PAGES[name]
                first, loads = Measured(title, "load", "first load"), Measured(title, "load", "load")
                rows += [first, loads]
                try:
                    first.seconds.append(d.load(path, timeout_ms=args.first_load_timeout * 1000))
                    for _ in range(args.repeat):
                        loads.seconds.append(d.load(path))
                except Exception as err:  # noqa: BLE001 — a bench reports what broke and goes on
                    loads.error = said(err)
                    print(f"  {title}, load: {loads.error}", flush=True)
                    continue
                print(f"  {title}: first load {first.seconds[0]:.2f} s, loads "
                      f"{' '.join(f'{s:.2f}' for s in loads.seconds)}", flush=True)
                for control, change, setup in table.get(name, []):
                    row = Measured(title, control)
                    rows.append(row)
                    try:
                        if setup:
                            setup()
                        for rep in range(args.repeat):
                            row.seconds.append(change(rep))
                    except Exception as err:  # noqa: BLE001
                        row.error = said(err)
                        try:
                            d.load(path)  # a fresh session for the next control
                        except Exception as again:  # noqa: BLE001
                            row.error += f"; reloading the page: {said(again)}"
                            break
                    print(f"  {title} · {control}: {' '.join(f'{s:.2f}' for s in row.seconds)}"
                          + (f"  ({row.error})" if row.error else ""), flush=True)
        except OutOfTime as err:  # what was measured so far is still printed
            print(f"  stopped: {err}", flush=True)
            if rows and not rows[-1].error:
                rows[-1].error = "stopped by --timeout"
        finally:
            browser.close()
    return rows


def print_tables(rows: list[Measured], repeat: int) -> None:
    print(f"\nControl changes, end to end in chromium (median and max of {repeat}; budget ≤ {BUDGET_S:g} s):\n")
    print("| page | control | median s | max s | within 1 s |")
    print("|---|---|---|---|---|")
    for m in rows:
        if m.kind != "change":
            continue
        r = m.row()
        if not r["seconds"]:
            print(f"| {m.page} | {m.what} | — | — | failed: {m.error} |")
            continue
        verdict = "yes" if r["within_budget"] else "**no**"
        note = f" ({len(r['seconds'])} of {repeat}: {m.error})" if m.error else ""
        print(f"| {m.page} | {m.what} | {r['median_s']:.2f} | {r['max_s']:.2f} | {verdict}{note} |")
    print(f"\nPage loads (the URL opened in the same tab: a new session; median and max of {repeat}), and the page's "
          "first load since the server started:\n")
    print("| page | median s | max s | first load s |")
    print("|---|---|---|---|")
    firsts = {m.page: m.seconds for m in rows if m.kind == "first load"}
    for m in rows:
        if m.kind == "load":
            first = f"{firsts[m.page][0]:.2f}" if firsts.get(m.page) else "—"
            shown = (f"{statistics.median(m.seconds):.2f} | {max(m.seconds):.2f}" if m.seconds and not m.error
                     else f"failed: {m.error} | —")
            print(f"| {m.page} | {shown} | {first} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="changes per control, loads per page")
    parser.add_argument("--pages", nargs="+", default=list(PAGES), choices=list(PAGES), metavar="NAME",
                        help=f"only these pages ({', '.join(PAGES)})")
    parser.add_argument("--runs", type=Path, help="a runs folder to read (e.g. a claims grid's, so that the Claims "
                        "page draws its cells over training) instead of two short runs trained first; the bench "
                        "starts no run in it")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--at-start", action="store_true",
                        help="load the first page the moment the server answers, before its warm-up ends (a link "
                             "opened at once); by default the bench waits for the warm-up's line on the log")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the whole bench")
    parser.add_argument("--step-timeout", type=float, default=120, help="seconds for one change or load")
    parser.add_argument("--first-load-timeout", type=float, default=600,
                        help="seconds for a page's first load (the Claims grid is computed then)")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        sys.exit("Debian's chromium is not installed (/usr/bin/chromium)")
    if args.runs is not None and not args.runs.is_dir():
        sys.exit(f"--runs {args.runs}: not a folder")

    def out_of_time(*_):
        raise OutOfTime(f"the bench ran past --timeout {args.timeout:g} s")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(args.timeout))
    server = None
    hard_stop = threading.Timer(args.timeout + 90, lambda: (local_server.stop(server) if server else None, os._exit(3)))
    hard_stop.daemon = True
    hard_stop.start()  # should the alarm's exception not get out of a stuck call
    work = Path(tempfile.mkdtemp(prefix="divviz-interaction-"))
    runs_dir, log_path = args.runs or work / "runs", work / "streamlit.log"
    started = time.time()
    try:
        if args.runs:
            print(f"{os.cpu_count()} cores; the runs folder {args.runs} ({len(list(args.runs.iterdir()))} entries); "
                  f"{args.repeat} changes per control", flush=True)
        else:
            runs_dir.mkdir()
            runs = make_runs(runs_dir)
            print(f"{os.cpu_count()} cores; {len(runs)} runs trained in {time.time() - started:.0f} s "
                  f"({', '.join(runs)}); {args.repeat} changes per control", flush=True)
        with open(log_path, "w") as log:
            server, url = local_server.start({"DIVVIZ_RUNS_DIR": str(runs_dir)}, log)
            if not args.at_start:
                print(f"  the server warmed itself in {wait_for_warm_up(log_path, args.first_load_timeout):.1f} s "
                      "after it answered", flush=True)
            rows = measure(args, url)
    except BaseException:
        if log_path.exists():
            print("the server's log, last lines:\n" + "\n".join(log_path.read_text().splitlines()[-20:]))
        raise
    finally:
        signal.alarm(0)
        if server is not None:
            local_server.stop(server)
        shutil.rmtree(work, ignore_errors=True)
    print_tables(rows, args.repeat)
    changes = [m for m in rows if m.kind == "change"]
    over = [f"{m.page} · {m.what}" for m in changes if m.seconds and max(m.seconds) > BUDGET_S]
    print(f"\nOver {BUDGET_S:g} s (the max of {args.repeat}): {len(over)} of {len(changes)} controls"
          + (f" ({'; '.join(over)})" if over else "") + f"; {time.time() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                                         "repeat": args.repeat, "budget_s": BUDGET_S,
                                         "rows": [m.row() for m in rows]}, indent=1, ensure_ascii=False))
    hard_stop.cancel()


if __name__ == "__main__":
    main()
