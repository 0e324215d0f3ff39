"""divviz: see what a policy-divergence constraint does to GRPO training of a language model."""

__version__ = "0.1.0"
