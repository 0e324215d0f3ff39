"""What verl loads in each of its processes (driver and Ray workers alike) through divviz's `verl.plugins` entry
point (pyproject.toml; verl imports every such entry point when it is imported, unless VERL_USE_EXTERNAL_PLUGINS says
otherwise): every catalogue clip test at its defaults as `divviz:<name>`, and each spelling listed in
$DIVVIZ_VERL_OBJECTIVES (separated by `;`, e.g. "kl3:delta=0.02;none,surrogate=cispo") as `divviz:<spelling>`.
A spelling that is not an objective stops verl's start with divviz's message."""

import os

from divviz.catalogue.divergences import CLIP_TESTS
from divviz.verl.policy_loss import register

REGISTERED = [register(name) for name in CLIP_TESTS if name != "formula"]  # a formula needs its text: name it
REGISTERED += [register(spec) for spec in os.environ.get("DIVVIZ_VERL_OBJECTIVES", "").split(";") if spec.strip()]
