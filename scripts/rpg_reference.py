"""Reference vectors from RPG's own code (complex-reasoning/RPG), saved as test data for divviz.

RPG's losses live in its fork of verl, ``verl/trainer/ppo/core_algos.py``, which imports
``verl.utils.torch_functional``. This script loads that one file from an RPG checkout, with verl 0.9.1's
``torch_functional`` installed beside it (the same venv as ``verl_reference.py``), and writes
``tests/data/rpg_reference.json``:

* ``compute_policy_loss_reinforce`` with kl_type ``rpg_rf_{fkl,rkl,ufkl,urkl}_clip_ppo`` (RPG's Algorithm 2: the
  KL term inside the clipped advantage), for its three ``loss_agg_mode``s, two β, on two seeded float64 batches:
  the loss, its autograd gradient in ``log_prob`` and the metrics;
* ``compute_rpg_outcome_advantage`` (group-mean baseline, no std) and ``compute_rpg_batchmean_outcome_advantage``
  (batch-mean baseline) on one reward batch.

Run it (divviz's tests never import RPG or verl)::

    git clone https://github.com/complex-reasoning/RPG /tmp/RPG
    /tmp/verlenv/bin/python scripts/rpg_reference.py /tmp/RPG

The output is deterministic.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "rpg_reference.json"
DT = torch.float64
KLS = ("fkl", "rkl", "ufkl", "urkl")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
BETAS = (1e-4, 0.5)  # RPG's default, and one where the KL term visibly moves the gradient


def load_core_algos(repo: Path):
    path = repo / "verl" / "trainer" / "ppo" / "core_algos.py"
    spec = importlib.util.spec_from_file_location("rpg_core_algos", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return module, commit


def batch(seed: int, rows: int = 6, tokens: int = 7) -> dict:
    """log-probs with ratios on both sides of the box and past c = 3, mixed-sign advantages with a zero, padding."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, tokens, generator=g, dtype=DT) * 3 - 0.05
    new = (old + 0.6 * torch.randn(rows, tokens, generator=g, dtype=DT)).clamp(max=-1e-3)
    new[0, 0] = old[0, 0] + 1.3  # w ≈ 3.7 > c
    adv = torch.randn(rows, 1, generator=g, dtype=DT).expand(rows, tokens).clone()
    adv[1] = 0.0
    lengths = torch.tensor([7, 5, 3, 7, 1, 6][:rows])
    mask = (torch.arange(tokens)[None] < lengths[:, None]).to(DT)
    return {"old_log_prob": old, "log_prob": new, "advantages": adv * mask, "response_mask": mask}


def lists(x):
    return x.tolist() if isinstance(x, torch.Tensor) else x


def main(repo: Path) -> None:
    core, commit = load_core_algos(repo)
    batches = {"a": batch(0), "b": batch(1)}
    losses = {}
    for name, b in batches.items():
        for kl in KLS:
            for mode in AGG_MODES:
                for beta in BETAS:
                    log_prob = b["log_prob"].clone().requires_grad_()
                    loss, clipfrac, ppo_kl, clipfrac_lower = core.compute_policy_loss_reinforce(
                        b["old_log_prob"], log_prob, b["advantages"], b["response_mask"], loss_agg_mode=mode,
                        kl_type=f"rpg_rf_{kl}_clip_ppo", kl_loss_coef=beta, clip_ratio_low=0.2, clip_ratio_high=0.28,
                        clip_ratio_c=3.0)
                    (grad,) = torch.autograd.grad(loss, log_prob)
                    clipfrac, ppo_kl, clipfrac_lower = (x.detach() for x in (clipfrac, ppo_kl, clipfrac_lower))
                    losses[f"{kl}/{mode}/{beta}/{name}"] = {
                        "kl": kl, "loss_agg_mode": mode, "beta": beta, "batch": name, "loss": loss.item(),
                        "grad_log_prob": lists(grad), "pg_clipfrac": clipfrac.item(), "ppo_kl": ppo_kl.item(),
                        "pg_clipfrac_lower": clipfrac_lower.item()}
    g = torch.Generator().manual_seed(2)
    scores = torch.randint(0, 3, (12,), generator=g).to(DT)
    rewards = torch.zeros(12, 4, dtype=DT)
    rewards[:, -1] = scores
    mask = torch.ones(12, 4, dtype=DT)
    index = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    group, _ = core.compute_rpg_outcome_advantage(rewards.clone(), mask, index)
    whole, _ = core.compute_rpg_batchmean_outcome_advantage(rewards.clone(), mask)
    data = {
        "meta": {"source": "complex-reasoning/RPG verl/trainer/ppo/core_algos.py", "commit": commit,
                 "verl_torch_functional": "verl 0.9.1", "torch": torch.__version__, "generated_by": Path(__file__).name,
                 "box": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}},
        "batches": {name: {k: lists(v) for k, v in b.items()} for name, b in batches.items()},
        "policy_loss": losses,
        "advantages": {"scores": lists(scores), "index": index.tolist(), "group_mean": lists(group[:, 0]),
                       "batch_mean": lists(whole[:, 0])},
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT} ({len(losses)} losses)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
