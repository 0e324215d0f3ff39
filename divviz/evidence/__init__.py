"""Evidence: intervals over seeds, paired differences, computed verdicts, and the claims reports built on them.

May import: the catalogue, the loss layer (`losses`, `metrics`, `loss_grids`), `divviz.bandit`, `divviz.engine`.
"""
