"""divviz inside TRL: any catalogue objective as the policy loss of TRL's `GRPOTrainer`, and its runs in the lab.

    pip install 'divviz[trl]'      # TRL 1.16; nothing else in divviz imports it

- `DivvizGRPOTrainer` (trainer.py): `GRPOTrainer` with the loss of a divviz `Objective`;
- `trl_args_for`, `trl_objective` (options.py): GRPOConfig's names for an objective, both ways;
- `DivvizRunCallback` (callback.py): writes a TRL run (plain or divviz) as a divviz run folder;
- `train` (run.py): `divviz train --backend trl`, a divviz run configuration on TRL's loop.
"""

from divviz.trl.callback import DivvizRunCallback
from divviz.trl.options import trl_args_for
from divviz.trl.trainer import DivvizGRPOTrainer

__all__ = ["DivvizGRPOTrainer", "DivvizRunCallback", "trl_args_for"]
