"""The bandit's sampler when it is not the policy, and verl's rollout corrections of it, for runs stepped together.

π_roll is the policy of `rollout_lag` iterations ago (the start policy until then), its logits rounded to
`rollout_dtype`, as an inference engine beside a trainer samples; π_old stays the current policy. Each run corrects
with its own `RolloutCorrection`, exactly as training does, or takes π_old from the sampler (verl's bypass mode).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from divviz.bandit.setting import BanditConfig, softmax
from divviz.catalogue.rollout_correction import SAMPLER_DTYPES, RolloutCorrection, rejection_mask, rollout_weights


class BanditRollout:
    """The sampler of bandit runs stepped together and their rollout corrections, one per run: (correction,
    bypass). π_roll is the policy of `rollout_lag` iterations ago (the start policy until then), its logits rounded
    to `rollout_dtype`. With ρ = π_old/π_roll of each sample, a run's `RolloutCorrection` gives its weights and
    rejected samples as `rollout_weights` and `rejection_mask` give them to training (each sample a one-token
    completion); in bypass mode the run's π_old is π_roll."""

    def __init__(self, cfg: BanditConfig, rows: list[tuple[RolloutCorrection, bool]],
                 policy: tuple[np.ndarray, np.ndarray]):
        self.dtype, self.history = SAMPLER_DTYPES[cfg.rollout_dtype], deque([policy], maxlen=cfg.rollout_lag + 1)
        self.roll = self._sampler()
        self.rows, self.bypass = rows, np.array([bypass for _, bypass in rows])
        self.weighs = any(c.rollout_is is not None for c, _ in rows)
        self.rejects = any(c.rollout_rs is not None for c, _ in rows)
        self.groups: dict[RolloutCorrection, list[int]] = {}  # the runs of each correction, corrected in one call
        for r, (correction, _) in enumerate(rows):
            self.groups.setdefault(correction, []).append(r)

    @staticmethod
    def needed(cfg: BanditConfig, rows: list[tuple[RolloutCorrection, bool]]) -> bool:
        """Whether these settings sample or correct otherwise than on-policy."""
        return cfg.rollout_dtype != "same" or cfg.rollout_lag > 0 or any(c.active or b for c, b in rows)

    def policy(self) -> tuple[np.ndarray, np.ndarray]:
        """π_roll's (log π, π), (R, K), for this iteration."""
        return self.roll

    def _sampler(self) -> tuple[np.ndarray, np.ndarray]:
        """The oldest policy kept, its logits rounded to the sampler's precision (with none, itself to the last bit)."""
        logp, p = self.history[0]
        if self.dtype is None:
            return logp, p
        return softmax(torch.from_numpy(logp).to(self.dtype).double().numpy())

    def push(self, policy: tuple[np.ndarray, np.ndarray]) -> None:
        """The policy (log π, π) after an iteration: the sampler reaches it `rollout_lag` iterations later."""
        self.history.append(policy)
        self.roll = self._sampler()

    def correct(self, logp_old: np.ndarray, logp_roll: np.ndarray, mask: np.ndarray):
        """(π_old the loss divides by, the policy term's weights or None, each run's loss mask — its samples less the
        rejected ones — or None), each (R, n, 1), from the samples' log-probs under π_old and π_roll."""
        weight = np.ones_like(logp_old) if self.weighs else None
        loss_mask = np.broadcast_to(mask, logp_old.shape).copy() if self.rejects else None
        log_ratio = torch.from_numpy(logp_old - logp_roll)
        for correction, rows in self.groups.items():
            # every sample is a one-token completion, so the runs' samples stack into one batch, (runs · n, 1), but
            # for batch normalisation, whose mean is each run's own
            parts = [[r] for r in rows] if correction.rollout_is_batch_normalize else [rows]
            for part in parts:
                ratio = log_ratio[part].reshape(-1, 1)
                ones = torch.ones_like(ratio)
                if correction.rollout_is is not None:
                    weight[part] = rollout_weights(ratio, ones, correction.rollout_is, correction.rollout_is_threshold,
                                                   correction.rollout_is_batch_normalize, with_metrics=False)[0].reshape(
                        len(part), -1, 1).numpy()
                if correction.rollout_rs is not None:
                    loss_mask[part] *= rejection_mask(ratio, ones, correction.rollout_rs,
                                                      correction.rollout_rs_threshold,
                                                      with_metrics=False)[0].reshape(len(part), -1, 1).numpy()
        old = np.where(self.bypass[:, None, None], logp_roll, logp_old) if self.bypass.any() else logp_old
        return old, weight, loss_mask
