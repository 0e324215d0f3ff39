"""The step inspector: kept completions equal `policy_loss`'s per-token outputs on the same batch, the explainer's
numbers equal a hand computation in each clip state, a local BPE model's completions render faithfully, hostile
text is escaped, the store keeps its byte cap, and the page works (AppTest; the browser test is in test_browser)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from divviz.catalogue.aggregation import aggregation_weights
from divviz.catalogue.divergences import clip_test
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import penalty
from divviz.catalogue.surrogates import surrogate
from divviz.engine.completions import check_record, token_pieces
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_batch, make_trainer, update
from divviz.engine.rollout import completion_logps
from divviz.losses import Objective
from divviz.runs import published, store
from divviz.runs.train import train
from divviz.safetext import literal
from divviz.views import explain, run_text, token_view

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert('x')</script> **bold** [l](http://127.0.0.1:9/) <img src=x onerror=alert(1)>"


def test_kept_facts_equal_policy_loss_on_the_same_batch():
    cfg = RunConfig.make(steps=1, prompts=3, group_size=4, clip="kl3", clip_params={"delta": 0.02}, penalty="k3",
                         beta=0.04, dual_clip_c=3.0, lr=0.05)  # a large lr: every clip state shows up
    record = grpo_step(make_trainer(cfg), 0).inspected
    tr = make_trainer(cfg)  # the same seed: the same batch and the same update, replayed by hand
    batch = make_batch(tr, 0)
    mask = batch.rollout.completion_mask
    with torch.no_grad():
        logp_ref = completion_logps(tr.reference, batch.rollout, cfg.temperature, tr.autocast)
        logp_old = completion_logps(tr.model, batch.rollout, cfg.temperature, tr.autocast)
    out = update(tr, batch, tr.objective, logp_ref, 0).out
    weight = aggregation_weights(mask.numpy(), "grpo", cfg.max_new_tokens)
    assert len(record["groups"]) == 2 and all(len(g["completions"]) == 4 for g in record["groups"])
    state = out.token_state()
    for row in range(8):
        t = record["groups"][row // 4]["completions"][row % 4]["tokens"]
        n = int(mask[row].sum())
        assert t["id"] == batch.rollout.completion_ids[row, :n].tolist()
        for fact, expected in (("pi_old", logp_old.exp()), ("ratio", out.ratio), ("measure", out.clip_value),
                               ("penalty", out.penalty), ("loss", out.per_token_loss), ("pi_ref", logp_ref.exp())):
            assert t[fact] == pytest.approx(expected[row, :n].tolist(), rel=1e-6, abs=1e-12), fact
        assert t["adv"] == pytest.approx([float(batch.adv[row])] * n, rel=1e-6)
        assert t["weight"] == pytest.approx(weight[row, :n].tolist(), rel=1e-6)
        assert t["state"] == state[row, :n].tolist()
    states = {s for g in record["groups"] for c in g["completions"] for s in c["tokens"]["state"]}
    assert len(states) >= 2, states


PPO_DUAL = Objective(clip=clip_test("ratio", eps=0.2), dual_clip_c=3.0)
HAND = [  # (w, A, state, ℓ, ∂ℓ/∂log π) for PPO ε = 0.2 with dual-clip c = 3, by hand from ℓ = −min(wA, clip(w)A)
    (1.1, 1.0, "inside", -1.1, -1.1),  # d(−wA)/d log π = −wA
    (0.5, -1.0, "masked low", 0.8, 0.0),  # −min(−0.5, −0.8) = 0.8, the constant l·A term
    (1.5, 1.0, "masked high", -1.2, 0.0),  # −min(1.5, 1.2) = −1.2, the constant u·A term
    (4.0, -1.0, "dual-clip", 3.0, 0.0),  # −min(−4, −1.2) = 4 > the cap −cA = 3
    (0.5, 1.0, "outside, pulled back", -0.5, -0.5),  # −min(0.5, 0.8): the unclipped term, gradient kept
    (1.5, -2.0, "outside, pulled back", 3.0, 3.0),  # −min(−3, −2.4) = 3 < cap 6: kept, pulls w down
]


@pytest.mark.parametrize("w, adv, state, loss, gradient", HAND)
def test_the_explainer_equals_a_hand_computation(w, adv, state, loss, gradient):
    e = explain.explain(PPO_DUAL, 0.3, w, adv, weight=0.25)
    assert e.state == state and e.masked == (state in ("masked low", "masked high", "dual-clip"))
    assert (e.loss, e.gradient) == pytest.approx((loss, gradient), abs=1e-12)
    assert (e.lower, e.upper) == pytest.approx((0.8, 1.2))
    assert (e.unclipped, e.clipped) == pytest.approx((w * adv, min(max(w, 0.8), 1.2) * adv))
    assert e.contribution == pytest.approx(0.25 * loss)
    lines = dict(e.lines())
    assert lines["gradient"].startswith("masked" if e.masked else "flows") and state in lines["gradient"]
    assert "masked (masked" not in lines["gradient"]  # a masked state is named once


def test_the_explainer_adds_the_penalty_and_puts_kl3s_numbers_in():
    """KL3 δ = 0.05 with β·k3 toward π_ref: k3 = r − log r − 1 with r = π_ref/π_θ, slope 1 − r (docs/theory.md §0)."""
    objective = Objective(clip=clip_test("kl3", delta=0.05), penalty=penalty("k3"), beta=0.1)
    pi_old, w, adv, pi_ref = 0.3, 1.5, 1.0, 0.2
    e = explain.explain(objective, pi_old, w, adv, pi_ref=pi_ref)
    r = pi_ref / (pi_old * w)
    lower, upper = 0.7161894551693442, 1.350403255977222  # docs/theory.md §5.1
    assert (e.lower, e.upper) == pytest.approx((lower, upper), rel=1e-9)
    assert e.clip_value == pytest.approx(w - 1 - math.log(w)) and e.state == "masked high"
    assert e.penalty_term == pytest.approx(0.1 * (r - math.log(r) - 1))
    assert e.loss == pytest.approx(-upper * adv + 0.1 * (r - math.log(r) - 1))
    assert e.gradient == pytest.approx(0.1 * (1 - r))  # the policy term is masked; only the penalty's slope
    with pytest.raises(DivvizInputError, match="needs π_ref"):
        explain.explain(objective, pi_old, w, adv)
    with pytest.raises(DivvizInputError, match="positive number"):
        explain.explain(objective, float("nan"), w, adv, pi_ref=pi_ref)


def test_the_explainer_takes_two_penalties_and_a_surrogate_apart():
    """GBMPO's prob_l2kl on one token: the penalty row adds β·k3 and λ·(π_θ − π_ref)²; a surrogate's row gives its
    own ℓ and gradient weight (sapo at w = 1: γ = 1) instead of PPO's min."""
    pi_old, w, adv, pi_ref = 0.3, 1.1, -0.5, 0.2
    both = Objective(clip=clip_test("ratio"), penalty=penalty("k3"), beta=0.04, second_penalty=penalty("prob_l2"),
                     second_beta=0.1)
    e = explain.explain(both, pi_old, w, adv, pi_ref=pi_ref)
    p, r = pi_old * w, pi_ref / (pi_old * w)
    assert e.penalty_term == pytest.approx(0.04 * (r - math.log(r) - 1) + 0.1 * (p - pi_ref) ** 2, rel=1e-12)
    assert e.gradient == pytest.approx(-w * adv + 0.04 * (1 - r) + 0.1 * 2 * p * (p - pi_ref), rel=1e-12)
    assert dict(e.lines())["penalty"].startswith("0.04·k3 + 0.1·prob_l2 = ")
    soft = explain.explain(Objective(surrogate=surrogate("sapo")), pi_old, 1.0, 2.0)
    lines = dict(soft.lines())
    assert "the min" not in lines and lines["surrogate"].startswith("sapo replaces PPO's min")
    assert soft.policy_gradient == pytest.approx(-2.0) and "γ = −(∂ℓ/∂log π_θ)/A = 1" in lines["gradient"]


def test_the_explainer_multiplies_the_policy_term_by_the_recorded_rho():
    """A token whose policy term the run multiplied by ρ (a rollout importance weight, TRL's masks): ℓ = ρ·policy +
    penalty and its gradient likewise, the off-policy mask left to ρ (it judged the whole completion); ρ = 0 masks
    the gradient."""
    pi_old, w, adv, pi_ref = 0.3, 1.1, 0.8, 0.2
    objective = Objective(clip=clip_test("ratio"), penalty=penalty("k3"), beta=0.04, off_policy_mask_threshold=0.0)
    plain = explain.explain(replace(objective, off_policy_mask_threshold=None), pi_old, w, adv, pi_ref=pi_ref)
    for rho in (0.0, 0.4, 1.7):
        e = explain.explain(objective, pi_old, w, adv, pi_ref=pi_ref, rho=rho)
        assert e.loss == pytest.approx(rho * plain.policy_loss + plain.penalty_term, rel=1e-12)
        assert e.gradient == pytest.approx(rho * plain.policy_gradient + (plain.gradient - plain.policy_gradient),
                                           rel=1e-12)
        lines = dict(e.lines())
        assert lines["ρ"].startswith(f"the policy term is multiplied by ρ = {rho:g}") and "ρ·(−min(…))" in lines["loss"]
        assert e.masked == (rho == 0)
    assert "ρ = 0" in dict(explain.explain(objective, pi_old, w, adv, pi_ref=pi_ref, rho=0.0).lines())["gradient"]


def test_the_page_explains_a_corrected_token_and_says_why_a_rejected_one_has_no_loss(tmp_path, monkeypatch):
    """A run with a sampler one update behind, token TIS and token_k1 rejection: a rejected token's explanation is
    the rejection's note, a kept one's multiplies by its ρ; ρ and the rollout gap colour the tokens."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    cfg = RunConfig.make(steps=2, prompts=4, group_size=4, max_new_tokens=6, lr=0.01, mu=1, inspect_prompts=4,
                         rollout_lag=1, rollout_is="token", rollout_is_threshold=1.2, rollout_rs="token_k1",
                         rollout_rs_threshold="0.8_1.25")
    folder = train(cfg, tmp_path)
    record = store.read_completions(folder, 2)
    where = [(g, c, i) for g, group in enumerate(record["groups"]) for c, comp in enumerate(group["completions"])
             for i, state in enumerate(comp["tokens"]["state"])]
    rejected = next(p for p in where if record["groups"][p[0]]["completions"][p[1]]["tokens"]["state"][p[2]] == 5)
    kept = next(p for p in where if record["groups"][p[0]]["completions"][p[1]]["tokens"]["state"][p[2]] != 5)
    at = app()  # on the run's last step, 2, where the sampler lags
    for (g, c, i), expect in ((rejected, "rejected this token"), (kept, "multiplied by ρ")):
        at.selectbox(key="inspector:completion").set_value(f"{g + 1}.{c + 1}").run()
        next(sb for sb in at.selectbox if sb.label == "Token").set_value(i).run()
        assert not at.exception, at.exception
        shown = html_bodies(at) + "".join(x.value for x in at.info)
        assert expect in shown, expect
    colour = next(sb for sb in at.selectbox if sb.label == "Colour tokens by")
    for choice in ("ρ", "rollout gap", "clip state"):
        colour.set_value(choice).run()
        assert not at.exception and choice in html_bodies(at)
    assert "rejected (rollout)" in html_bodies(at)


def bpe_model(folder: Path) -> Path:
    """A byte-level BPE tokenizer trained here and a tiny Llama on it, saved as a local Hugging Face folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["rev:abc=cba", "the cat sat\n on the mat", "naïve café", "<script>alert(1)</script>"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<eos>", "<bos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>")
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    fast.save_pretrained(folder)
    return folder


def test_a_local_bpe_model_trains_and_its_completions_render(tmp_path):
    model = bpe_model(tmp_path / "bpe")
    folder = train(RunConfig.make(model=str(model), steps=2, prompts=2, group_size=4, max_new_tokens=12,
                                  inspect_prompts=1), tmp_path / "runs")
    assert store.read_run(folder).state == "done" and store.completion_steps(folder) == [1, 2]
    record = store.read_completions(folder, 2)
    assert len(record["groups"]) == 1 and len(record["groups"][0]["completions"]) == 4
    html = token_view.record_html(record, "ratio")
    assert html.count("class='dv-t") == sum(len(c["tokens"]["id"]) for c in record["groups"][0]["completions"])

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer("the cat\n🙂 <script>")["input_ids"] + [tokenizer.eos_token_id]
    pieces = token_pieces(tokenizer, ids)
    assert any(p.startswith(" ") and len(p) > 1 for p in pieces["piece"])  # a multi-character piece with its space
    assert "\n" in pieces["piece"] and pieces["special"][-1] and pieces["raw"][-1] == "<eos>"
    assert sum("\ufffd" in p for p in pieces["piece"]) >= 2  # 🙂's four bytes, none a character alone
    shown = "".join(token_view.piece_html(p, r, s) for p, r, s in zip(pieces["piece"], pieces["raw"],
                                                                      pieces["special"]))
    assert "↵\n" in shown and "dv-bytes" in shown and "dv-special" in shown
    assert "&lt;" in shown and "<script" not in shown


def hostile_record(record: dict) -> dict:
    group = record["groups"][0]
    group["prompt"] = HOSTILE
    completion = group["completions"][0]
    completion["text"] = HOSTILE
    completion["tokens"]["piece"][0] = HOSTILE
    completion["tokens"]["raw"][0] = "<img src=x onerror=alert(2)>"
    return record


def test_hostile_text_is_escaped_everywhere(tmp_path):
    folder = train(RunConfig.make(steps=1, prompts=1, group_size=2, max_new_tokens=4), tmp_path)
    record = hostile_record(store.read_completions(folder, 1))
    for colour_by in token_view.COLOUR_BY:
        html = token_view.record_html(record, colour_by, selected=(0, 0, 0))
        assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_the_record_keeps_its_byte_cap(tmp_path):
    cfg = dict(steps=1, prompts=4, group_size=8, max_new_tokens=8, inspect_prompts=4)
    whole = train(RunConfig.make(**cfg), tmp_path / "whole")
    capped = train(RunConfig.make(**cfg, inspect_bytes=6_000), tmp_path / "capped")
    full, cut = store.read_completions(whole, 1), store.read_completions(capped, 1)
    assert full["omitted"] == 0 and sum(len(g["completions"]) for g in full["groups"]) == 32
    size = (capped / "completions" / "step_000001.json").stat().st_size
    assert size <= 6_000 and cut["omitted"] > 0
    assert sum(len(g["completions"]) for g in cut["groups"]) + cut["omitted"] == 32
    assert "more completions were left out" in token_view.record_html(cut, "clip state")


def test_corrupt_records_are_refused_with_a_reason(tmp_path):
    folder = train(RunConfig.make(steps=1, prompts=1, group_size=2, max_new_tokens=4), tmp_path)
    path = folder / "completions" / "step_000001.json"
    good = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    bad["groups"][0]["completions"][0]["tokens"]["state"][0] = 7
    for text, reason in (("{not json", "not JSON"), ("[1, 2]", "not a record"), (json.dumps(bad), "clip state")):
        path.write_text(text)
        with pytest.raises(store.CorruptRun, match=reason):
            store.read_completions(folder, 1)
    with pytest.raises(store.CorruptRun, match="no completions for step 9"):
        store.read_completions(folder, 9)
    assert check_record(good, "x") is good


def app(link: dict | None = None):
    """The inspector opened as a user would, from a link's query parameters `link` if given."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300)
    at.query_params.update(link or {})
    at.run()
    at.switch_page("app_pages/step_inspector.py").run()
    return at


def html_bodies(at) -> str:
    return "".join(element.proto.body for element in at.get("html"))


def test_the_page_shows_a_run_and_explains_a_token(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = app()
    assert not at.exception and any("No run with kept completions" in i.value for i in at.info)
    folder = train(RunConfig.make(steps=2, prompts=2, group_size=4, clip="kl3", lr=0.05, max_new_tokens=6), tmp_path)
    (folder / "completions" / "step_000002.json").write_text(
        json.dumps(hostile_record(store.read_completions(folder, 2))))
    at = app()
    assert not at.exception, at.exception
    assert at.caption[0].value == literal(run_text.run_choice(store.read_run(folder)))  # whole, under the heading
    body = html_bodies(at)
    assert "&lt;script&gt;" in body and "<script" not in body and "<img" not in body
    assert "masked" in body or "inside" in body
    at.selectbox(key="inspector:completion").set_value("2.3").run()
    token = next(sb for sb in at.selectbox if sb.label == "Token")
    token.set_value(len(token.options) - 1).run()
    assert not at.exception
    body = html_bodies(at)
    assert "the min" in body and "kl3(w)" in body and ("masked" in body or "flows" in body)
    colour = next(sb for sb in at.selectbox if sb.label == "Colour tokens by")
    for choice in token_view.COLOUR_BY:
        colour.set_value(choice).run()
        assert not at.exception and choice in html_bodies(at)
    at.selectbox(key="inspector:m_add").set_value("ratio").run()
    assert not at.exception and html_bodies(at).count("the min") == 2  # the run's kl3, and PPO's ratio test


def test_the_page_says_what_is_wrong_with_a_corrupt_record(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    folder = train(RunConfig.make(steps=1, prompts=1, group_size=2, max_new_tokens=4), tmp_path)
    (folder / "completions" / "step_000001.json").write_text('{"groups": [{"prompt": 3}]}')
    at = app()
    assert not at.exception and any("is not a prompt with completions" in e.value for e in at.error)


def test_same_batch_records_show_each_measure_on_the_same_completions():
    from divviz.engine.compare import same_batch

    cfg = RunConfig.make(prompts=2, group_size=4, max_new_tokens=6, lr=0.05)
    a, b = same_batch(cfg, [("ppo", Objective(clip=clip_test("ratio"))),
                            ("kl3", Objective(clip=clip_test("kl3", delta=0.01)))])
    ta, tb = (r.record["groups"][0]["completions"][0]["tokens"] for r in (a, b))
    assert ta["id"] == tb["id"] and ta["pi_old"] == tb["pi_old"]  # the same completion, the same start
    assert ta["measure"] != tb["measure"]
    assert f"{len(ta['id'])} tokens" in token_view.state_counts(ta)
    np.testing.assert_allclose([x for x in ta["ratio"]], a.ratio[:len(ta["ratio"])], rtol=1e-6)


def token_box(at):
    return next(sb for sb in at.selectbox if sb.label == "Token")


def test_the_token_box_names_a_token_by_its_text_not_its_raw_bpe_piece(tmp_path, monkeypatch):
    """Byte-level BPE writes " equals" as the piece "Ġequals" and a newline as "Ċ": the Token box lists the text, its
    whitespace visible ("␣equals", "↵"), and a special token by its name."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    folder = train(RunConfig.make(steps=1, prompts=1, group_size=2, max_new_tokens=6), tmp_path)
    path = folder / "completions" / "step_000001.json"
    record = json.loads(path.read_text())
    tokens = record["groups"][0]["completions"][0]["tokens"]
    n = len(tokens["id"])
    assert n >= 4, n  # the tiny model's completion to this seed's prompt, cut at max_new_tokens
    bpe = [(" equals", "Ġequals", False), (" +", "Ġ+", False), ("\n", "Ċ", False), ("<|im_end|>", "<|im_end|>", True)]
    tokens["piece"], tokens["raw"], tokens["special"] = (list(column) for column in zip(*(bpe * n)[:n]))
    path.write_text(json.dumps(record))
    options = token_box(app()).options
    states = [option.split(" · ")[-1] for option in options]
    assert options[:4] == [f"0: ␣equals · {states[0]}", f"1: ␣+ · {states[1]}", f"2: ↵ · {states[2]}",
                           f"3: <|im_end|> (special) · {states[3]}"]
    assert not any("Ġ" in o or "Ċ" in o or "'" in o for o in options)


def marked_tokens(body: str) -> int:
    """How many token spans of the inspector's text have a colour other than white (the re-score's marks)."""
    import re

    backgrounds = re.findall(r"class='dv-t[^']*' style='background:([^;']+)", body)
    return sum(b not in ("rgb(255,255,255)", "transparent") for b in backgrounds)


def test_rescore_colouring_marks_the_tokens_any_added_test_judges_otherwise(tmp_path, monkeypatch):
    """The run's own PPO box added first (it judges every token as the run did) and a narrow one second: the tokens
    the second judges otherwise are marked, as the table counts them. Coin rewards give every group advantages (a
    group of equal rewards has none, and so no token a box could mask), and a small step keeps the ratios near 1,
    inside PPO's box and outside the narrow one, whatever tokens a seed samples (at lr 0.05 most left both boxes)."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    folder = train(RunConfig.make(steps=1, prompts=4, group_size=4, max_new_tokens=6, lr=0.002, mu=3, reward="random",
                                  inspect_prompts=4), tmp_path)
    from divviz.evidence.rescore import rescore_step

    own, agreeing, narrow = rescore_step(folder, 1, ["ratio", "ratio:eps=0.01"])
    assert agreeing["changed"] == 0 and narrow["changed"] > 0
    at = app({"m": "ratio,ratio:eps=0.01", "colour": "re-score"})
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "gradient_flows" in d.value.columns)
    assert list(table["changed"]) == [own["changed"], 0, narrow["changed"]]
    next(sb for sb in at.selectbox if sb.label == "Colour tokens by").set_value("re-score").run()
    assert marked_tokens(html_bodies(at)) == narrow["changed"]
    assert any("judge otherwise" in c.value for c in at.caption)


def test_the_link_holds_the_run_step_colouring_completion_and_token(tmp_path, monkeypatch):
    """Every choice of the page goes into its link, and the link opens the same run, step, colouring, completion and
    token; a link to a run that is not there says so and shows the newest."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    for seed in (1, 2):
        train(RunConfig.make(steps=2, prompts=2, group_size=4, max_new_tokens=6, seed=seed), tmp_path)
    newest, older = (run.name for run in store.list_runs(tmp_path))
    at = app()
    assert not at.exception, at.exception
    link = lambda: {k: v if isinstance(v, str) else v[-1] for k, v in at.query_params.items()}  # noqa: E731
    assert link()["run"] == newest and link()["step"] == "2"
    at.selectbox(key="inspector:run").set_value(older).run()
    assert at.select_slider(key="inspector:step").label == "Step (2 kept: 1, 2)"  # which steps there are to pick
    assert run_text.kept_steps_label(list(range(5, 55, 5))) == "Step (10 kept: 5, 10, …, 50)"
    at.select_slider(key="inspector:step").set_value(1).run()
    next(sb for sb in at.selectbox if sb.label == "Colour tokens by").set_value("ratio").run()
    at.selectbox(key="inspector:completion").set_value("2.3").run()
    token_box(at).set_value(1).run()
    assert not at.exception, at.exception
    shared = link()
    assert {k: shared[k] for k in ("run", "step", "colour", "completion", "token")} == {
        "run": older, "step": "1", "colour": "ratio", "completion": "2.3", "token": "1"}
    opened = app(shared)  # another browser, from the link
    assert not opened.exception and not opened.warning, opened.warning
    assert opened.selectbox(key="inspector:run").value == older and opened.select_slider(key="inspector:step").value == 1
    assert next(sb for sb in opened.selectbox if sb.label == "Colour tokens by").value == "ratio"
    assert opened.selectbox(key="inspector:completion").value == "2.3" and token_box(opened).value == 1
    assert "class='dv-t dv-sel'" in html_bodies(opened)
    gone = app({"run": "<b>no-such-run</b>", "step": "7"})
    assert not gone.exception and gone.selectbox(key="inspector:run").value == newest
    said = [w.value for w in gone.warning]
    assert any("<b>no-such-run</b>" in w.replace("\\", "") for w in said) and not any("<b>" in w for w in said)


def test_every_token_colour_keeps_its_text_readable(tmp_path):
    """WCAG 2's contrast ratio (black on white 21, #777 on white 4.48: its reference values) between a token's text
    and its background is at least 4.5 on every colour the scales and the clip states make; a special token on the
    darkest blue is written in white."""
    assert token_view.contrast_ratio("#fff", "#000") == pytest.approx(21)
    assert token_view.contrast_ratio("#777777", "rgb(255,255,255)") == pytest.approx(4.48, abs=0.01)
    for colour in [token_view.background(v, 1.0) for v in np.linspace(-1, 1, 401)] + list(token_view.STATE_COLOURS):
        assert token_view.contrast_ratio(colour, token_view.text_colour(colour)) >= 4.5, colour
    tokens = {"id": [1, 2], "piece": ["<|im_end|>", "a"], "raw": ["<|im_end|>", "a"], "special": [True, False],
              "state": [0, 0], "pi_old": [0.5, 0.5], "pi_new": [0.01, 0.5], "ratio": [1.0, 1.0], "adv": [1.0, 1.0],
              "measure": None, "penalty": None, "pi_ref": None, "loss": [0.0, 0.0], "weight": [1.0, 1.0]}
    html = token_view.completion_html(tokens, token_view.colours(tokens, "Δπ", 0.49))
    assert "background:rgb(33,102,172);color:#fff" in html and "dv-special" in html


def test_a_step_the_loss_learned_nothing_from_says_so_and_names_the_steps_it_did(tmp_path, monkeypatch,
                                                                                  repository_published):
    """The published H200 KL3 run of seed 0 collapsed: at step 30 its kept prompt's completions are all equally
    rewarded (A = 0), at step 1 they are not; a step opens on its first completion the loss learns from."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    grid = repository_published / "smollm2-135m-stress-h200"
    runs = json.loads((grid / "manifest.json").read_text())["runs"]
    name = next(n for n, r in runs.items() if r["measure"] == "KL3 δ=0.05 (wide)" and r["seed"] == 0)
    at = app({"run": name, "step": "30"})
    assert not at.exception, at.exception
    said = [i.value.replace("\\", "") for i in at.info]  # outside text is escaped for Markdown
    assert any("Every completion kept at step 30 (its first 1 prompt) has advantage 0" in s and "learns from: 1." in s
               for s in said)
    at = app({"run": name, "step": "1"})
    assert not at.exception and not any("has advantage 0" in i.value for i in at.info)
    g, c = map(int, at.selectbox(key="inspector:completion").value.split("."))
    record = store.read_completions(published.unpacked(grid / name), 1)
    assert token_view.completion(record, g - 1, c - 1)["advantage"] != 0
