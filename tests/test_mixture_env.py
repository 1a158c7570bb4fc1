"""A mixture of tasks in an environment (issue 45, item 6): each task's accuracy counts the
environment's rewards as the total does, so the per-task numbers average to the total."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import CLI_SMALL, cli_run

GIFT = '''
from llmrl.envs import EnvStep


class Gift:
    """Ends every episode after one turn with a reward of 1 for the arithmetic task's rows, 0 for the
    others (arithmetic#2: the same rows under a second label)."""

    def reset(self, row, seed):
        self.task = row["task"]
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, calls):
        return EnvStep(reward=1.0 if self.task == "arithmetic" else 0.0, done=True)
'''


def test_per_task_accuracy_counts_the_environments_reward(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The random tiny model answers no held-out question right (task reward 0), so an episode reaches the
    success threshold 1 exactly when Gift rewards it: accuracy/arithmetic = 1, accuracy/arithmetic#2 = 0, and
    with the held-out rows interleaved (4 of each in eval.size 8) the total is (4·1 + 4·0) / 8 = 0.5. Scored
    with the task's reward alone (before), accuracy/arithmetic was 0 while the total said 0.5."""
    env = tmp_path / "gift.py"
    env.write_text(GIFT)
    out = tmp_path / "mix"
    code, stdout, stderr = cli_run(["train", "--model", str(tiny_model_dir), "--task", "arithmetic,arithmetic",
                                    "--env", f"{env}:Gift", "--steps", "1", "--out", str(out), *CLI_SMALL,
                                    "--set", "eval.size=8", "--set", "rollout.max_new_tokens=4"])
    assert code == 0, stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    for when in ("before", "after"):
        assert summary[f"eval_accuracy/arithmetic_{when}"] == 1.0
        assert summary[f"eval_accuracy/arithmetic#2_{when}"] == 0.0
        assert summary[f"eval_accuracy_{when}"] == 0.5
    code, stdout, stderr = cli_run(["eval", "--model", str(out), "--samples", "0", "--json"])  # `llmrl eval` agrees
    assert code == 0, stderr
    greedy = json.loads(stdout)["greedy"]
    assert greedy["accuracy"] == 0.5 and greedy["accuracy/arithmetic"] == 1.0 and greedy["accuracy/arithmetic#2"] == 0.0
