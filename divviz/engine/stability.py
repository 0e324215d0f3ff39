"""How stable a run has been so far, added to every metrics row (divviz's engine and its TRL backend alike).

    stability/max_kl         the largest kl/k3 of one update so far (the update's k3 of w = π_new/π_old)
    stability/max_clip       the largest clip_ratio/region_mean of one step so far
    stability/collapsed      0, then 1 from the step the run collapsed on
    stability/collapse_step  that step (only in the rows from it on)

A run collapses at step t when, with r̄ and ē the means of the reward and the entropy over the last `WINDOW` steps,

    reward collapse    r̄_t < ½ · max_{s ≤ t} r̄_s  while  max kl/k3 over the last WINDOW steps > KL_COLLAPSE,
                       once that peak was at least PEAK_FLOOR (a run that never learned cannot lose it), or
    entropy collapse   ē_t < ENTROPY_FLOOR · ē of the first WINDOW steps,

and stays collapsed. The reward rule is the one UNIPO's DAPO log shows (poloclub/unipo, `dapo_metrics.json`: the
reward falls from 0.41 to 0.09 as the KL jumps); the KL condition keeps a reward that merely wanders (a hard batch)
from counting. A run whose loss or weights became NaN fails instead (`grpo.NonFiniteLoss`), which the Runs table
shows as its state.
"""

from __future__ import annotations

from collections import deque

WINDOW = 5  # steps averaged for r̄ and ē
KL_COLLAPSE = 0.05  # an update's kl/k3 above this is a large step: SmolLM2's learning runs stayed below 0.039 in all
# of their steps, the stress run reached 0.40 (docs/learning.md)
PEAK_FLOOR = 0.1  # the trailing reward must once have reached this for its fall to count
ENTROPY_FLOOR = 0.1  # the entropy fell to a tenth of its start
RULE = (f"the mean reward of {WINDOW} steps below half its running peak while an update's KL (k3) was above "
        f"{KL_COLLAPSE:g}, or the mean entropy of {WINDOW} steps below {ENTROPY_FLOOR:g} × its start")  # as pages say it


class Stability:
    """Feed each step's metrics in order (`update`); it returns the stability metrics of the run up to that step."""

    def __init__(self):
        self.rewards: deque[float] = deque(maxlen=WINDOW)
        self.kls: deque[float] = deque(maxlen=WINDOW)
        self.entropies: deque[float] = deque(maxlen=WINDOW)
        self.max_kl = self.max_clip = 0.0
        self.peak = self.start_entropy = None
        self.collapse_step: int | None = None

    def update(self, step: int, metrics: dict) -> dict[str, float]:
        reward, kl, entropy = (metrics.get(key) for key in ("reward", "kl/k3", "entropy"))
        self.max_kl = max(self.max_kl, kl or 0.0)
        self.max_clip = max(self.max_clip, metrics.get("clip_ratio/region_mean") or 0.0)
        for values, value in ((self.rewards, reward), (self.kls, kl), (self.entropies, entropy)):
            if value is not None:
                values.append(value)
        if self.collapse_step is None and self._collapsed():
            self.collapse_step = step
        row = {"stability/max_kl": self.max_kl, "stability/max_clip": self.max_clip,
               "stability/collapsed": float(self.collapse_step is not None)}
        if self.collapse_step is not None:
            row["stability/collapse_step"] = float(self.collapse_step)
        return row

    def _collapsed(self) -> bool:
        if len(self.entropies) == WINDOW:
            mean_entropy = sum(self.entropies) / WINDOW
            self.start_entropy = mean_entropy if self.start_entropy is None else self.start_entropy
            if self.start_entropy > 0 and mean_entropy < ENTROPY_FLOOR * self.start_entropy:
                return True
        if len(self.rewards) < WINDOW:
            return False
        mean_reward = sum(self.rewards) / WINDOW
        self.peak = mean_reward if self.peak is None else max(self.peak, mean_reward)
        return self.peak >= PEAK_FLOOR and mean_reward < self.peak / 2 and max(self.kls, default=0.0) > KL_COLLAPSE
