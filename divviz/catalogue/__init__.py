"""The catalogue: every named measure with its parameters, valid ranges, feasible intervals and closed forms
(clip tests, penalties, surrogates, estimators, mirror maps, the user's formula, aggregations, verl's rollout
corrections, the KL3 theory).

May import: `divviz.safetext` and itself. Nothing here imports torch's training code or any layer below.
"""
