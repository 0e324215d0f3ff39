"""The algorithm: the built-in and real policies, tasks, prompts, the rollout, the GRPO step and its mini-batch
updates, what a step measures, the held-out evaluation and a run's stability. Run management is `divviz.runs`."""
