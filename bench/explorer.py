"""How long the explorer pages take to recompute every figure after one control change.

Target: under 50 ms per change, on the machine it runs on; the bandit page at its defaults
now trains 8 seeds × 3 measures and draws their means, bands and paired differences, within the same budget as
one seed did; two rows train each measure under three rollout corrections with a bfloat16 sampler two
iterations behind. Each page is timed
as the app runs it — `divviz.views.explorer` computes with the training loss and builds the figures — with a
different control value each repetition so that nothing is served from a cache. The last column adds
what Streamlit then does with each figure (`to_dict` and plotly's JSON encoding, the page's message to the
browser). The named baselines, for the bandit: its runs stepped one at a time instead of side by side as one (R, K) array
(`bandit.run_bandits`), and its step taken by autograd through `policy_loss` instead of the loss's
closed-form gradient (`losses.PolicyLossGradient`); all give the same runs (tests/bandit/test_bandit.py).

    python bench/explorer.py [--repeats N]
"""

import argparse
import statistics
import time

import plotly.io as pio

from divviz.bandit.grpo import run_bandit
from divviz.bandit.setting import BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective
from divviz.views import explorer, run_views

BUDGET_MS = 50.0


def timed(fn, values):
    times = []
    for v in values:
        start = time.perf_counter()
        result = fn(v)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    deltas = [0.02 + 0.001 * i for i in range(args.repeats)]

    def regions(delta, charts=("intervals", "sweeps", "surrogate", "weight")):
        """What the page builds on a change: its three charts and the open tab's (the first: the gradient weight)."""
        tests = [clip_test("ratio"), clip_test("clip_higher"), clip_test("kl3", delta=delta)]
        return explorer.clipping_regions(tests, pi_old=0.3, dual_clip_c=3.0, charts=charts)

    def kl3(delta):
        return explorer.kl3_equivalence(delta, 0.2, 0.2, 0.28, seed=0)[1]

    cfg = BanditConfig().to_dict()
    measures = lambda delta: [Objective(clip=clip_test("ratio")), Objective(clip=clip_test("clip_higher")),  # noqa: E731
                              Objective(clip=clip_test("kl3", delta=delta))]

    def page(groups):
        """Everything the bandit page computes from its runs: figures, paired table and paired chart."""
        return {**explorer.mass_reallocation(groups), "table": explorer.paired_differences(groups, 0),
                "paired": explorer.paired_difference_chart(groups, 0, "entropy")}

    def bandit(shared: bool, seeds: int = 8, variants=None, **changes):
        """A change of KL3's δ (only its runs re-train) or, `shared`, of a setting all runs share (the first seed):
        all of them re-train, side by side; `variants`: rollout corrections, one run each per measure and seed."""
        def change(delta):
            setting = {**cfg, **changes, **({"seed": round(delta * 1000)} if shared else {})}
            return page(explorer.bandit_runs(setting, measures(delta), seeds, variants))
        return change

    corrections = [explorer.rollout_variant(name, 2.0, (0.5, 2.0), "token_k1", (0.5, 2.0), 0.05, False)
                   for name in ("none", "TIS token", "rejection")]
    lagging = {"rollout_lag": 2, "rollout_dtype": "bfloat16"}

    def one_at_a_time(seeds: int = 8, **changes):  # baseline: the same shared change, each run stepped alone
        def change(delta):
            first = round(delta * 1000)
            return page([[run_bandit(BanditConfig.make(**{**cfg, **changes, "seed": first + s}), objective)
                          for s in range(seeds)] for objective in measures(delta)])
        return change

    kept = explorer.bandit_runs(cfg, measures(0.05), 8)

    def redraw(delta):  # a change that only redraws (e.g. the page reopened, or another baseline chosen)
        return page(kept)

    large = {"k": 1000, "iterations": 200}
    regions(0.05), kl3(0.05), bandit(True)(0.05)  # warm-up: imports, first SciPy call
    print(f"{'page (one control change)':<58} {'median ms':>10} {'/ 50 ms':>8} {'+ sent to browser ms':>21}")
    for name, fn in (("clipping regions (3 tests, 4 figures: the open tab's)", regions),
                     ("  every tab's 8 figures (all tabs drawn; baseline)",
                      lambda delta: regions(delta, explorer.CLIPPING_CHARTS)),
                     ("KL3 ⇔ asymmetric clipping (2 figures)", kl3),
                     ("mass reallocation, 8 seeds × 3: δ change, 8 of 24 re-train", bandit(False)),
                     ("mass reallocation, 8 seeds × 3: shared setting, 24 re-train", bandit(True)),
                     ("  one seed × 3, δ change (before seeds; baseline)", bandit(False, seeds=1)),
                     ("  one seed × 3, shared setting (before seeds; baseline)", bandit(True, seeds=1)),
                     ("  8 × 3, shared, runs stepped one at a time (baseline)", one_at_a_time()),
                     ("  8 × 3, shared, by autograd (baseline)", bandit(True, autograd=True)),
                     ("  8 × 3, δ change at K = 1000 and 200 iterations", bandit(False, **large)),
                     ("  8 × 3, shared at K = 1000 and 200 iterations", bandit(True, **large)),
                     ("  8 × 3 × 3 corrections, bf16 sampler 2 behind: δ change", bandit(False, variants=corrections,
                                                                                      **lagging)),
                     ("  8 × 3 × 3 corrections, bf16 sampler 2 behind: shared", bandit(True, variants=corrections,
                                                                                   **lagging)),
                     ("mass reallocation: redraw only (5 figures and the table)", redraw)):
        ms, charts = timed(fn, deltas)
        figures = [c.figure for c in charts.values() if hasattr(c, "figure")]
        sent, _ = timed(lambda _: [pio.to_json(f.to_dict(), validate=False) for f in figures], deltas[:5])
        print(f"{name:<58} {ms:>10.1f} {ms / BUDGET_MS:>8.2f} {ms + sent:>21.1f}")


def inspector(repeats: int) -> None:
    """The step inspector at its defaults (a default run's step: 2 prompts × 8 completions kept, coloured by clip
    state, the run's measure and two more explained): what the page computes when the step changes (the record
    read from disk and checked, the HTML, the explainer, the region picture) and when only the token changes (the
    record comes from Streamlit's cache). Target: ≤ 100 ms."""
    import tempfile
    from pathlib import Path

    from divviz.engine.config import RunConfig
    from divviz.runs import store
    from divviz.runs.train import train
    from divviz.views import explain, token_view

    folder = train(RunConfig.make(steps=repeats, clip="kl3", clip_params={"delta": 0.02}),
                   Path(tempfile.mkdtemp(prefix="divviz-bench-")))
    objectives = run_views.explained_objectives(store.read_run(folder).config, [clip_test("ratio"),
                                                                             clip_test("clip_higher")])

    def draw(record, token):
        tokens = record["groups"][0]["completions"][0]["tokens"]
        i = token % len(tokens["id"])
        html = token_view.record_html(record, "clip state", selected=(0, 0, i))
        lines = [explain.explain_stored(o, tokens, i, label).lines() for label, o in objectives]
        chart = run_views.token_region(objectives, tokens["pi_old"][i], tokens["ratio"][i], tokens["pi_new"][i])
        return html, lines, chart

    cached = store.read_completions(folder, 1)
    draw(cached, 0)  # warm-up
    step_ms, (html, _, chart) = timed(lambda s: draw(store.read_completions(folder, s), s), range(1, repeats + 1))
    token_ms, _ = timed(lambda t: draw(cached, t), range(repeats))
    sent, _ = timed(lambda _: pio.to_json(chart.figure.to_dict(), validate=False), range(5))
    print(f"\n{'step inspector (defaults: 16 completions kept, 3 measures)':<58} {'median ms':>10} {'/ 100 ms':>8} "
          f"{'+ sent to browser ms':>21}")
    print(f"{'  change the step (record read from disk)':<58} {step_ms:>10.1f} {step_ms / 100:>8.2f} "
          f"{step_ms + sent:>21.1f}")
    print(f"{'  change the token':<58} {token_ms:>10.1f} {token_ms / 100:>8.2f} {token_ms + sent:>21.1f}")
    print(f"  (the step's record: {len(html) / 1000:.0f} kB of HTML)")


if __name__ == "__main__":
    main()
    inspector(15)
