"""Completions as text, every token coloured by one of its facts: the step inspector's drawing.

Input is a record of `engine.completions.step_record` (checked by `store.read_completions`); output is HTML in
which every piece of text from the model or the tokenizer is escaped (`html.escape`), so a completion holding
HTML, markdown or `<script>` shows as those characters. Pieces are shown as they are: spaces and newlines kept
(a newline also marked ↵), special tokens boxed, a piece that does not decode alone (byte fallback, part of a
UTF-8 character) shown as the tokenizer's raw piece in a dashed box. Hovering a token shows all its facts. Where a
token is named in a list (the inspector's Token box), it is the text it decodes to with its whitespace made visible
("␣equals"), not the tokenizer's raw piece ("Ġequals").

Colour scales: the clip state is categorical; the others diverge around their neutral value (1 for the ratio, read
on log w; 1 for ρ; 0 for the rest), blue below and red above, saturating at the largest |value − neutral| of the
record. Each token's text is black or white, whichever contrasts more with its background (WCAG 2's contrast
ratio, at least 4.5 on every colour these scales make), so a token on a saturated colour stays readable.
"""

from __future__ import annotations

import html
import math
import operator

from divviz.engine.completions import REJECTED
from divviz.losses import TOKEN_STATES
from divviz.safetext import literal

STATE_COLOURS = ("transparent", "#9ecae1", "#fc9272", "#c994c7", "#fdd49e", "#bdbdbd")  # TOKEN_STATES, in order
BELOW, ABOVE = (33, 102, 172), (178, 24, 43)


def fact(tokens: dict, name: str, i: int):
    """Token i's `name`; None where it is not known (a fact its writer did not have is None as a whole, e.g. π after
    the update in a TRL run, or absent from a record written before it was kept)."""
    values = tokens.get(name)
    return None if values is None else values[i]


def _combined(t, i, a: str, b: str, combine):
    x, y = fact(t, a, i), fact(t, b, i)
    return None if x is None or y is None else combine(x, y)


def _adv_times_ratio(t, i):
    return _combined(t, i, "adv", "ratio", operator.mul)


def _delta_pi(t, i):
    return _combined(t, i, "pi_new", "pi_old", operator.sub)


def _loss_share(t, i):
    return _combined(t, i, "weight", "loss", operator.mul)


def _log_ratio(t, i):
    w = fact(t, "ratio", i)
    return None if not w or w <= 0 else math.log(w)


def _rollout_gap(t, i):
    """log π_old − log π_roll: how the sampler's probability of the token differs from the trained policy's."""
    old, roll = fact(t, "pi_old", i), fact(t, "pi_roll", i)
    return None if not old or not roll else math.log(old) - math.log(roll)


def _rho_from_one(t, i):
    rho = fact(t, "rho", i)
    return None if rho is None else rho - 1


COLOUR_BY = {  # name → (value of token i of tokens t, what the legend says)
    "clip state": (None, "what the constraint did to the token"),
    "ratio": (_log_ratio, "w = π_θ/π_old at the last optimiser step (scale on log w, white at w = 1)"),
    "Δπ": (_delta_pi, "π after the update − π_old (white at 0)"),
    "A·w": (_adv_times_ratio, "advantage × ratio, the unclipped surrogate term (white at 0)"),
    "penalty": (lambda t, i: fact(t, "penalty", i), "the penalty's value (white at 0)"),
    "loss share": (_loss_share, "weight·ℓ: what the token adds to the batch's loss (white at 0; they sum to L)"),
    "ρ": (_rho_from_one, "ρ − 1: what multiplied the token's policy term, a rollout importance weight or TRL's masks "
                         "(white at ρ = 1; blank: nothing did)"),
    "rollout gap": (_rollout_gap, "log π_old − log π_roll: the trained policy against the sampler that drew the token "
                                  "(white at 0; blank: on-policy)"),
    "entropy": (lambda t, i: fact(t, "entropy", i), "H of the whole next-token distribution the token was drawn from, "
                                                    "in nats (white at 0: certain)"),
    "top-1 mass": (lambda t, i: fact(t, "top1", i), "the largest probability of that distribution (white at 0)"),
    "entropy covariance": (lambda t, i: fact(t, "entropy_cov", i),
                           "(log π_old − mean)(A − mean) over the tokens shown: red pushes the entropy down (a likely "
                           "token pushed up, a rare one down), blue up (Cui et al. 2025; white at 0)"),
    "re-score": (lambda t, i: fact(t, "rescored", i),
                 "red: how many of the clip tests added to re-score this step give the token another clip state than "
                 "the run's own (white: none does; blank: the loss did not see it)"),
}

def with_fact(record: dict, name: str, value) -> dict:
    """The record with one more per-token fact `name`: value(tokens, group, completion, i) for each token. A new
    dict: the record given (Streamlit's cached copy) is left as it is."""
    return {**record, "groups": [{**group, "completions": [
        {**comp, "tokens": {**comp["tokens"], name: [value(comp["tokens"], g, c, i)
                                                    for i in range(len(comp["tokens"]["id"]))]}}
        for c, comp in enumerate(group["completions"])]} for g, group in enumerate(record["groups"])]}


def with_rescore(record: dict, changed_by_test: list[list[tuple]]) -> dict:
    """The record with the fact `rescored`: on each token the loss saw, how many of the added clip tests judge it
    otherwise than the run's own measure (`changed_by_test`: each test's changed tokens, (group, completion,
    position, …) as `evidence.rescore` lists them)."""
    marks = [{tuple(c[:3]) for c in changed} for changed in changed_by_test]
    return with_fact(record, "rescored", lambda t, g, c, i: None if t["state"][i] == REJECTED or t.get("ratio") is None
                     or t["ratio"][i] is None else float(sum((g, c, i) in marked for marked in marks)))


def with_entropy_covariance(record: dict) -> dict:
    """The record with each token's entropy covariance term (log π_old(y_t) − mean)(A_t − mean) as its fact
    `entropy_cov`, the means over the record's tokens that the loss saw (`metrics.entropy_covariance` sums the
    same terms over the whole batch by clip state)."""
    tokens = [c["tokens"] for g in record["groups"] for c in g["completions"]]
    kept = [(math.log(t["pi_old"][i]), t["adv"][i]) for t in tokens for i in range(len(t["id"]))
            if t["state"][i] != REJECTED and t["pi_old"][i]]
    mean_lp, mean_adv = (sum(x) / max(len(kept), 1) for x in zip(*kept)) if kept else (0.0, 0.0)
    return with_fact(record, "entropy_cov", lambda t, g, c, i: None if t["state"][i] == REJECTED or not t["pi_old"][i]
                     else (math.log(t["pi_old"][i]) - mean_lp) * (t["adv"][i] - mean_adv))


NON_NEGATIVE = ("entropy", "top-1 mass", "re-score")  # colourings of a quantity that is never below 0


def values(record: dict, colour_by: str) -> list[list[list[float | None]]]:
    """Per group, per completion, per token: the value the colour encodes."""
    fn = COLOUR_BY[colour_by][0]
    return [[[fn(c["tokens"], i) for i in range(len(c["tokens"]["id"]))] for c in g["completions"]]
            for g in record["groups"]]


def scale_of(record: dict, colour_by: str) -> float:
    """The largest |value − neutral| in the record (the colour saturates there); 1 if there is none."""
    if COLOUR_BY[colour_by][0] is None:
        return 1.0
    found = [abs(v) for g in values(record, colour_by) for c in g for v in c if v is not None]
    return max(found, default=0.0) or 1.0


def background(value: float | None, scale: float) -> str:
    """Diverging: white at 0, toward blue below and red above, full at ±scale."""
    if value is None:
        return "transparent"
    t = min(1.0, abs(value) / scale)
    r, g, b = ABOVE if value > 0 else BELOW
    mix = lambda c: round(255 + (c - 255) * t)  # noqa: E731
    return f"rgb({mix(r)},{mix(g)},{mix(b)})"


def text_colour(background_colour: str) -> str:
    """Black or white: whichever has the larger WCAG 2 contrast ratio with `background_colour` ("rgb(r,g,b)",
    "#rrggbb", or "transparent", taken as the page's white). The ratio is (L₁ + 0.05)/(L₂ + 0.05) with L the
    relative luminance; black and white meet at L ≈ 0.18, where each has 4.58, so the chosen one has at least that."""
    return "#000" if contrast_ratio(background_colour, "#000") >= contrast_ratio(background_colour, "#fff") else "#fff"


def contrast_ratio(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two colours, 1 (the same) to 21 (black on white)."""
    low, high = sorted((luminance(a), luminance(b)))
    return (high + 0.05) / (low + 0.05)


def luminance(colour: str) -> float:
    """WCAG 2's relative luminance of "rgb(r,g,b)", "#rrggbb", "#rgb" or "transparent" (white, the page below)."""
    if colour == "transparent":
        channels = (255, 255, 255)
    elif colour.startswith("rgb("):
        channels = tuple(int(x) for x in colour[4:-1].split(","))
    else:
        digits = colour.lstrip("#")
        digits = "".join(d * 2 for d in digits) if len(digits) == 3 else digits
        channels = tuple(int(digits[k:k + 2], 16) for k in (0, 2, 4))
    linear = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


VISIBLE_WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def readable_piece(tokens: dict, i: int) -> str:
    """Token i as a list names it: the text it decodes to, its whitespace made visible (" equals" → "␣equals") and
    any other unprintable character escaped ("\\u202e"); a special token ("<|im_end|>") or a piece that does not
    decode alone ("<0xE2>") as the tokenizer's raw piece."""
    piece, raw = tokens["piece"][i], tokens["raw"][i]
    if tokens["special"][i] or "\ufffd" in piece:
        return raw
    shown = "".join(VISIBLE_WHITESPACE.get(ch, ch if ch.isprintable() else ascii(ch)[1:-1]) for ch in piece)
    return shown or "∅"


def completions_of(record: dict) -> list[tuple[int, int]]:
    """(prompt, completion) of every completion a step's record keeps, in its order, from 0."""
    return [(g, c) for g, group in enumerate(record["groups"]) for c in range(len(group["completions"]))]


def learned_from(record: dict) -> list[tuple[int, int]]:
    """The completions of a step's record with a nonzero advantage: those the loss learns from (a group whose rewards
    are all equal, as in a collapsed run, has none)."""
    return [(g, c) for g, c in completions_of(record) if completion(record, g, c)["advantage"] != 0]


def completion(record: dict, g: int, c: int) -> dict:
    """Completion c of prompt g of a step's record: its reward, advantage and tokens."""
    return record["groups"][g]["completions"][c]


def completion_label(record: dict, g: int, c: int) -> str:
    return f"prompt {g + 1} · completion {c + 1} · reward {completion(record, g, c)['reward']:.3g}"


def completion_caption(record: dict, g: int, c: int) -> str:
    """The prompt, the reward and the advantage of completion c of prompt g (outside text: shown, never rendered)."""
    chosen = completion(record, g, c)
    return literal(f"prompt: {record['groups'][g]['prompt']} · reward {chosen['reward']:.3g} · "
                   f"A {chosen['advantage']:+.3g}")


def token_choice(tokens: dict, i: int) -> str:
    """"6: ␣equals · masked high": a token as the inspector's Token box lists it."""
    special = " (special)" if tokens["special"][i] else ""
    return f"{i}: {readable_piece(tokens, i)}{special} · {TOKEN_STATES[tokens['state'][i]]}"


def pi_after_unknown(config: dict) -> str:
    """Why a run's record has no π after the update, named by where the run came from (its config's `backend` and,
    for an import, its `source`)."""
    after = "so Δπ is blank and the token has no point after the update."
    source = config.get("source") if isinstance(config.get("source"), dict) else {}
    if config.get("backend") == "import":
        fmt = {"jsonl": "divviz's JSONL format", "unipo": "UNIPO's schema", "trl": "TRL's trainer_state.json",
               "verl": "verl's file-logger JSONL"}.get(source.get("format"), str(source.get("format", "a file")))
        return (f"π after the update is not known for this run: it was imported (divviz import) from "
                f"{source.get('file', 'a file')!r} in {fmt}, which gives log π at the update and not after it, "
                f"{after}")
    if config.get("backend") == "trl":
        return ("π after the update is not known for this run: its trainer (TRL) makes no forward pass after the "
                f"update, {after}")
    return f"π after the update is not known for this run: its writer recorded none, {after}"


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.5g}" if isinstance(x, float) else str(x)


def hover(tokens: dict, i: int) -> str:
    """All of token i's facts, one per line (plain text: it goes into an escaped title attribute)."""
    parts = [f"token {i} · id {tokens['id'][i]} · {readable_piece(tokens, i)} (raw {tokens['raw'][i]!r})"
             + (" (special)" if tokens['special'][i] else ""),
             f"π_old {_fmt(fact(tokens, 'pi_old', i))} → π after " + (
                 "not known" if tokens["pi_new"] is None
                 else f"{_fmt(fact(tokens, 'pi_new', i))} (Δπ {_fmt(_delta_pi(tokens, i))})"),
             f"w {_fmt(fact(tokens, 'ratio', i))} · A {_fmt(fact(tokens, 'adv', i))} · "
             f"A·w {_fmt(_adv_times_ratio(tokens, i))}",
             f"state: {TOKEN_STATES[tokens['state'][i]]}"]
    if tokens.get("pi_roll") is not None:
        parts.append(f"π_roll {_fmt(fact(tokens, 'pi_roll', i))} (the sampler's) · log π_old/π_roll "
                     f"{_fmt(_rollout_gap(tokens, i))}")
    if tokens.get("rho") is not None:
        parts.append(f"ρ {_fmt(fact(tokens, 'rho', i))} (multiplied the policy term)")
    if tokens["measure"] is not None:
        parts.append(f"measure {_fmt(fact(tokens, 'measure', i))}")
    if tokens["penalty"] is not None:
        parts.append(f"penalty {_fmt(fact(tokens, 'penalty', i))}" + (f" · π_ref {_fmt(fact(tokens, 'pi_ref', i))}"
                                                                if tokens["pi_ref"] is not None else ""))
    parts.append(f"ℓ {_fmt(fact(tokens, 'loss', i))} · weight {_fmt(fact(tokens, 'weight', i))} · weight·ℓ "
                 f"{_fmt(_loss_share(tokens, i))}")
    return "\n".join(parts)


def piece_html(piece: str, raw: str, special: bool) -> str:
    """One token's text, escaped and made visible."""
    if special:
        return f"<span class='dv-special'>{html.escape(raw)}</span>"
    if "\ufffd" in piece:
        return f"<span class='dv-bytes'>{html.escape(raw)}</span>"
    return html.escape(piece).replace("\n", "↵\n") or "∅"


STYLE = ("<style>.dv-c{font-family:ui-monospace,monospace;white-space:pre-wrap;line-height:1.9;font-size:14px}"
         ".dv-t{border-radius:3px;padding:1px 0;border-right:1px solid rgba(0,0,0,.08)}"
         ".dv-sel{outline:2px solid #000;outline-offset:1px}"
         ".dv-special{border:1px solid currentColor;border-radius:3px;padding:0 2px;font-size:11px}"
         ".dv-bytes{border:1px dashed currentColor;border-radius:3px;padding:0 2px;font-size:11px}"
         ".dv-legend span{display:inline-block;padding:1px 6px;margin-right:6px;border-radius:3px;"
         "border:1px solid #ddd;font-size:12px}</style>")


def state_counts(tokens: dict) -> str:
    """"3 masked high, 1 outside, pulled back of 8 tokens"; "all 8 tokens inside"."""
    counts = [(sum(s == code for s in tokens["state"]), name) for code, name in enumerate(TOKEN_STATES) if code]
    said = ", ".join(f"{k} {name}" for k, name in counts if k)
    return f"{said} of {len(tokens['state'])} tokens" if said else f"all {len(tokens['state'])} tokens inside"


def completion_html(tokens: dict, colours: list[str], selected: int | None = None) -> str:
    """A completion's tokens as spans: coloured, hover text with every fact, the selected one outlined."""
    spans = []
    for i in range(len(tokens["id"])):
        cls = "dv-t dv-sel" if i == selected else "dv-t"
        spans.append(f"<span class='{cls}' style='background:{colours[i]};color:{text_colour(colours[i])}' "
                     f"title='{html.escape(hover(tokens, i), quote=True)}'>"
                     f"{piece_html(tokens['piece'][i], tokens['raw'][i], tokens['special'][i])}</span>")
    return f"<div class='dv-c'>{''.join(spans)}</div>"


def colours(tokens: dict, colour_by: str, scale: float) -> list[str]:
    fn = COLOUR_BY[colour_by][0]
    n = len(tokens["id"])
    if fn is None:
        return [STATE_COLOURS[s] for s in tokens["state"]]
    return [background(fn(tokens, i), scale) for i in range(n)]


def legend_html(colour_by: str, scale: float) -> str:
    if COLOUR_BY[colour_by][0] is None:
        items = [f"<span style='background:{c if c != 'transparent' else '#fff'}'>{html.escape(s)}</span>"
                 for s, c in zip(TOKEN_STATES, STATE_COLOURS)]
    else:
        neutral = {"ratio": "w = 1", "ρ": "ρ = 1"}.get(colour_by, "0")
        low, high = {"ratio": (f"w = {math.exp(-scale):.3g}", f"w = {math.exp(scale):.3g}"),
                     "ρ": (f"ρ = {1 - scale:.3g}", f"ρ = {1 + scale:.3g}")}.get(colour_by,
                                                                           (f"{-scale:.3g}", f"{scale:.3g}"))
        lowest, highest = background(-scale, scale), background(scale, scale)
        items = [f"<span style='background:{lowest};color:{text_colour(lowest)}'>{low} or below</span>",
                 f"<span style='background:#fff'>{neutral}</span>",
                 f"<span style='background:{highest};color:{text_colour(highest)}'>{high} or above</span>"]
        if colour_by in NON_NEGATIVE:  # nothing below 0 to show
            items = items[1:]
    return (f"<div class='dv-legend'><b>{html.escape(colour_by)}</b>: {html.escape(COLOUR_BY[colour_by][1])}<br>"
            + "".join(items) + "</div>")


def minibatch_note(completion: dict) -> str:
    """" · mini-batch 3 · mean w 1.012": where the update had several mini-batches, the one this completion trained
    in and its tokens' mean ratio there (at the last pass; "" otherwise)."""
    if "minibatch" not in completion:
        return ""
    ratios = [w for w in completion["tokens"].get("ratio") or [] if w is not None]
    return f" · mini-batch {int(completion['minibatch'])}" + (f" · mean w {sum(ratios) / len(ratios):.4g}" if ratios else "")


def record_html(record: dict, colour_by: str, selected: tuple[int, int, int] | None = None,
                scale: float | None = None) -> str:
    """Every prompt with its completions (reward and advantage beside each, and the mini-batch each trained in), then
    the legend."""
    scale = scale_of(record, colour_by) if scale is None else scale
    parts = [STYLE, legend_html(colour_by, scale)]
    for g, group in enumerate(record["groups"]):
        parts.append(f"<p><b>prompt {g + 1}</b>: <code>{html.escape(group['prompt'])}</code></p>")
        for c, completion in enumerate(group["completions"]):
            chosen = selected[2] if selected is not None and selected[:2] == (g, c) else None
            parts.append(f"<div style='margin:2px 0 6px 12px'><small>completion {c + 1} · reward "
                         f"{completion['reward']:.3g} · A {completion['advantage']:+.3g}{minibatch_note(completion)}"
                         "</small>"
                         + completion_html(completion["tokens"], colours(completion["tokens"], colour_by, scale),
                                           chosen) + "</div>")
    if record.get("omitted"):
        parts.append(f"<p><small>{int(record['omitted'])} more completions were left out to keep this step's record "
                     f"within {int(record.get('byte_cap', 0))} bytes.</small></p>")
    return "".join(parts)


def explanation_html(lines: list[tuple[str, str]]) -> str:
    """The token explainer's (what, formula with numbers) rows as a table, escaped."""
    rows = "".join(f"<tr><th style='text-align:left;padding-right:8px;vertical-align:top'>{html.escape(what)}</th>"
                   f"<td style='font-family:ui-monospace,monospace;font-size:13px'>{html.escape(text)}</td></tr>"
                   for what, text in lines)
    return f"<table style='border-collapse:collapse'>{rows}</table>"
