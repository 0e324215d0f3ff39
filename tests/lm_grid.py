"""The built-in LM's small claims grid the tests train once per session (the `lm_plan` fixture, tests/conftest.py)."""

import time

LM_SEEDS, LM_STEPS = 3, 3


def wait_until_finished(plan, timeout=900):
    deadline = time.time() + timeout
    while not plan.finished:
        assert time.time() < deadline, "the pool did not finish the built-in LM runs"
        time.sleep(0.5)
        plan = plan.refreshed()
    return plan
