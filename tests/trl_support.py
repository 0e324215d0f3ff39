"""What the TRL tests share (`test_trl.py`, the loss against TRL's own; `test_trl_runs.py`, real TRL runs): the task,
the built-in model's policy and a small CPU GRPOConfig. Import it after `pytest.importorskip("trl")`."""

from pathlib import Path

from trl import GRPOConfig

from divviz.engine.policy import builtin_policy
from divviz.engine.tasks import get_task

APP = Path(__file__).resolve().parents[1] / "router.py"
TASK = get_task("reverse")


def load_policy():
    """The built-in model and tokenizer for TASK (a module-scoped fixture in each test file)."""
    return builtin_policy(TASK)


def config(tmp_path, **settings) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                bf16=False, use_cpu=True, gradient_checkpointing=False, report_to="none", save_strategy="no",
                disable_tqdm=True, seed=0, learning_rate=1e-3)
    return GRPOConfig(**{**base, **settings})
