"""SmolLM2's held-out evaluation with each batch's prompts prefilled once for both ways (`rollout.sample_ways`) against
a prefill per way, side by side in one run, and whether the two gave the same answers to the bit.

The held-out evaluation of `add` (`engine/evaluate.py`: 128 problems in batches of 64, sampled at τ = 0.7 and
greedily, up to 24 tokens) of SmolLM2-135M-Instruct as it starts, on the run's precision and 2 threads (as
`divviz train` runs alone). Baseline: every batch sampled at τ, then every batch greedily, each call prefilling its
prompts (`rollout.sample`, the evaluation before the shared prefill). The two alternate, the baseline first, for
`--repeats` rounds after one warm-up round; the figures are medians. Same bits: every sampled and greedy token,
log-prob, entropy and top-1 mass of the two ways equal in every round.

    python bench/evaluation.py [--repeats N] [--dtype bfloat16|float32] [--device cpu|cuda]
"""

import argparse
import statistics
import time

import torch

from divviz.engine.config import RunConfig
from divviz.engine.evaluate import EVAL_BATCH, EVAL_SEED, WAYS
from divviz.engine.grpo import make_trainer
from divviz.engine.prompts import prompt_ids
from divviz.engine.rollout import encode_prompts, sample, sample_ways
from divviz.engine.smollm2 import NAME

FACTS = ("completion_ids", "completion_mask", "logp", "entropy", "top1", "was_argmax")


def answers(tr, shared: bool) -> list:
    """The evaluation's rollouts, in the order the baseline makes them (every batch sampled, then every batch
    greedily), from one prefill per batch (`shared`) or one per way."""
    problems = tr.task.held_out()
    asked = prompt_ids(tr.tokenizer, tr.task, [prompt for prompt, _ in problems], tr.prompt_format)
    generator = torch.Generator(device=tr.device).manual_seed(EVAL_SEED)
    kwargs = dict(eos_id=tr.tokenizer.eos_token_id, pad_id=tr.tokenizer.pad_token_id,
                  max_new_tokens=tr.cfg.max_new_tokens, temperature=tr.cfg.temperature, generator=generator,
                  autocast=tr.autocast)
    batches = [encode_prompts(asked[first:first + EVAL_BATCH], tr.tokenizer.pad_token_id, 1, tr.device)
               for first in range(0, len(problems), EVAL_BATCH)]
    if shared:
        both = [sample_ways(tr.model, ids, mask, WAYS, **kwargs) for ids, mask in batches]
        return [pair[way] for way in range(len(WAYS)) for pair in both]
    return [sample(tr.model, ids, mask, greedy=greedy, **kwargs) for greedy in WAYS for ids, mask in batches]


def timed(tr, shared: bool) -> tuple[float, list]:
    if tr.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = answers(tr, shared)
    if tr.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds timed after the warm-up")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(2)
    tr = make_trainer(RunConfig.make(model=NAME, device=args.device, dtype=args.dtype))
    tr.model.eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {tr.device}, {tr.dtype or torch.float32}; "
          f"{len(tr.task.held_out())} held-out problems × {len(WAYS)} ways; median of {args.repeats} rounds after a "
          "warm-up")
    seconds, same = {False: [], True: []}, True
    for round_ in range(args.repeats + 1):
        baseline_s, baseline = timed(tr, shared=False)
        shared_s, shared = timed(tr, shared=True)
        same &= all(torch.equal(getattr(a, f), getattr(b, f)) for a, b in zip(baseline, shared) for f in FACTS)
        if round_:
            seconds[False].append(baseline_s)
            seconds[True].append(shared_s)
    before, after = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"a prefill per way (baseline) {before:.2f} s, one prefill for both ways {after:.2f} s: "
          f"{after / before:.2f}×; the same answers to the bit: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
