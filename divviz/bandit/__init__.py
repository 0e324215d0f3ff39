"""The exact softmax bandit: its setting, its sampler, GRPO iterations with the closed-form gradient of the loss.

May import: the catalogue, `divviz.losses`, `divviz.metrics`, `divviz.safetext`.
"""
