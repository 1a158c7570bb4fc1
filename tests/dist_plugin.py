"""Test-only tasks for the subprocess runs of test_distributed.py, registered on import
(`--set estimator.module=tests.dist_plugin`, so every torchrun worker registers them too).

- `dist_digits`: the arithmetic prompts, reward = share of digits in the completion (a random model earns it).
- `dist_dying`: like `dist_digits`, but the process whose RANK equals $LLMRL_TEST_DIE_RANK exits abruptly
  (os._exit, no cleanup) in its $LLMRL_TEST_DIE_CALL-th reward call.
"""

from __future__ import annotations

import os

from llmrl.tasks import TASKS, Task, get_task


from tests.helpers import digit_share


_calls = {"n": 0}


def dying_reward(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
    _calls["n"] += 1
    die = os.environ.get("LLMRL_TEST_DIE_RANK")
    if die is not None and os.environ.get("RANK") == die and _calls["n"] == int(os.environ["LLMRL_TEST_DIE_CALL"]):
        os._exit(3)
    return digit_share(prompts, completions, answer)


def _with(name: str, reward) -> Task:
    base = get_task("arithmetic")
    return Task(name, base.train, base.eval, reward)


TASKS["dist_digits"] = lambda: _with("dist_digits", digit_share)
TASKS["dist_dying"] = lambda: _with("dist_dying", dying_reward)
