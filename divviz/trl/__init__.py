"""divviz inside TRL: any catalogue objective as the policy loss of TRL's `GRPOTrainer`, and its runs in the lab.

    pip install 'divviz[trl]'      # TRL 1.16; nothing else in divviz imports it

- `DivvizGRPOTrainer` (trainer.py): `GRPOTrainer` with the loss of a divviz `Objective`;
- `DivvizRunCallback` (callback.py): writes a TRL run (plain or divviz) as a divviz run folder;
- `train` (run.py): `divviz train --backend trl`, a divviz run configuration on TRL's loop.
"""

from divviz.trl.callback import DivvizRunCallback
from divviz.trl.trainer import DivvizGRPOTrainer, trl_args_for

__all__ = ["DivvizGRPOTrainer", "DivvizRunCallback", "trl_args_for"]
