"""How long chromium takes to draw the Runs page's overlay once its data has arrived: 10 runs of S steps.

For each S, the training charts of 10 synthetic runs (`store_scale.make_runs`, the engine's format) are built by the
same `run_views.training_charts` the page calls, and their figures — exactly the specs Streamlit sends, thinned for
display — are drawn in Debian's chromium (Playwright) with the plotly.js that the `plotly` package bundles: the time
from calling `Plotly.newPlot` on every panel to the last one resolving. The same for the unthinned export figures
(every point), once, for comparison. Each measurement runs in a fresh browser. Streamlit's frontend bundles its own build of plotly.js; the figures are the same.
Target (issue: long runs): the overlay of 10 runs × 50,000 steps drawn within 1 s of the data arriving.

    python bench/chart_draw.py [--sizes 1000 10000 50000] [--repeats 3]
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import plotly.offline
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_scale import make_runs  # noqa: E402

from divviz.runs import store  # noqa: E402
from divviz.views import run_views  # noqa: E402

PAGE = """<html><head><script>{plotly}</script></head><body>{divs}<script>
window.draw = async function () {{
  const figures = {figures};
  const start = performance.now();
  await Promise.all(figures.map((f, i) => Plotly.newPlot("c" + i, f.data, f.layout)));
  await new Promise(requestAnimationFrame);  // the frame that shows them
  const took = performance.now() - start;
  figures.forEach((f, i) => Plotly.purge("c" + i));
  return took;
}};
</script></body></html>"""


def page(figures: list[dict]) -> str:
    divs = "".join(f'<div id="c{i}" style="width:1200px;height:380px"></div>' for i in range(len(figures)))
    return PAGE.format(plotly=plotly.offline.get_plotlyjs(), divs=divs, figures=json.dumps(figures))


def draw_times(play, figures: list[dict], repeats: int) -> list[float]:
    """Each draw's seconds, in a browser of its own (a browser still tearing down an earlier page's WebGL traces
    would slow the next one)."""
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "charts.html"
        html.write_text(page(figures))
        browser = play.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1300, "height": 2200})
        tab.goto(html.as_uri())
        times = [tab.evaluate("draw()") / 1000 for _ in range(repeats)]
        browser.close()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 50_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with sync_playwright() as play:
        for size in args.sizes:
            with tempfile.TemporaryDirectory() as tmp:
                runs = [(folder.name, store.read_metrics(folder)) for folder in make_runs(Path(tmp), 10, size)]
                charts = run_views.training_charts(runs)
            shown = [chart.figure.to_dict() for chart in charts.values()]
            whole = [(chart.export or chart.figure).to_dict() for chart in charts.values()]
            drawn = draw_times(play, shown, args.repeats)
            every = draw_times(play, whole, 1)  # minutes at 50,000 steps: once
            rows.append((size, statistics.median(drawn), every[0], len(json.dumps(shown)),
                         len(json.dumps(whole))))
            print(f"S = {size}: thinned {[round(t, 3) for t in drawn]} s, every point {every[0]:.3f} s", flush=True)
    print("\n| steps per run (10 runs, 5 panels) | drawn, as shown (median) | drawn, every point (once) | "
          "bytes shown | bytes, every point |")
    print("|---|---|---|---|---|")
    for size, drawn, every, small, big in rows:
        print(f"| {size:,} | {drawn:.3f} s | {every:.3f} s | {small / 1e6:.2f} MB | {big / 1e6:.2f} MB |")
    if rows and rows[-1][0] == 50_000:
        print(f"\n10 runs × 50,000 steps drawn in {rows[-1][1]:.3f} s (target ≤ 1 s)")


if __name__ == "__main__":
    main()
