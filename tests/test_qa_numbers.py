"""Issue 17, items 7-14: numbers that used to be silently wrong, and user code that failed silently.

Each test failed before its fix: the adaptive KL controller driven below zero, rewards beyond
float32 and NaN/Infinity in the JSON logs, rewards of the wrong type or that call sys.exit, a causal
LM taken for a reward model, stop tokens of the generation config ignored, nucleus sampling and a
k1 KL in the loss accepted in training, and `llmrl eval` of a run without a held-out split."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config
from llmrl.run.checkpoint import list_checkpoints
from llmrl.cli import app
from llmrl.config.schema import LoraConfig
from llmrl.engines import build_engine
from llmrl.engines.hf import generate
from llmrl.run.evaluate import evaluate
from llmrl.step.score import RewardFailed, score_parts, score_texts
from llmrl.step.generate import encode_prompts
from llmrl.errors import ConfigError
from llmrl.kl_control import KLController
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.rewards import Component, WeightedReward, build_reward
from llmrl.rewards.model import RewardModel
from llmrl.run.folder import RunFolder

from .conftest import make_tiny_model

CPU = torch.device("cpu")
SMALL = ["--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.every=0",
         "--set", "threads=1", "--set", "rollout.max_new_tokens=4"]


def _cli(args: list[str], input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args, input=input)
    return result.exit_code, result.stdout, result.stderr


def _refused(args: list[str], message: str, code: int = 2) -> None:
    """The CLI exits `code` with exactly `message` as its one line on stderr, no traceback."""
    exit_code, stdout, stderr = _cli(args)
    assert exit_code == code, (exit_code, stdout, stderr)
    assert stderr.strip() == f"error: {message}", stderr
    assert "Traceback" not in stdout + stderr


# --- 7. the adaptive KL controller keeps β > 0 ---------------------------------------------------

def test_adaptive_beta_stays_positive_with_a_horizon_shorter_than_a_step() -> None:
    # target 0.1, horizon 1, n = 32 samples a step. KL = 0 → e = clip(0/0.1 − 1, ±0.2) = −0.2 and
    # min(n/horizon, 1) = 1: β ← 0.02 · 0.8 = 0.016 (was 0.02 · (1 − 0.2·32) = −0.108); ten steps:
    # 0.02 · 0.8^10 = 0.02 · 0.1073741824 = 0.0021474836.
    ctl = KLController(beta=0.02, adaptive=True, target=0.1, horizon=1)
    ctl.update(0.0, 32)
    assert math.isclose(ctl.beta, 0.016, abs_tol=1e-9)
    for _ in range(9):
        ctl.update(0.0, 32)
    assert math.isclose(ctl.beta, 0.0021474836, abs_tol=1e-9) and ctl.beta > 0
    # KL = 1 → e = clip(9, ±0.2) = 0.2: β ← 0.0021474836 · 1.2 = 0.0025769803
    ctl.update(1.0, 32)
    assert math.isclose(ctl.beta, 0.0025769803, abs_tol=1e-9)
    # below the cap nothing changes: horizon 64, n = 32 → 1 − 0.2 · 0.5 = 0.9: 0.02 → 0.018
    slow = KLController(beta=0.02, adaptive=True, target=0.1, horizon=64)
    slow.update(0.0, 32)
    assert math.isclose(slow.beta, 0.018, abs_tol=1e-9)


# --- 12, 13. settings whose numbers would be wrong are refused -------------------------------------

TOP_P = ("'rollout.top_p' is 0.9, but training samples at top_p=1: log π_old and the update's log π are of the "
         "full tempered policy, not of the truncated nucleus, so the PPO ratio would not be the sampler's; lower "
         "rollout.temperature instead.")
K1_LOSS = ("'kl.estimator' k1 with kl.placement=loss regularises nothing: the expected gradient of log π − log π_ref "
           "under the policy's own samples is zero; use kl.estimator=k3 (or k2) in the loss, or kl.placement=reward.")


def test_nucleus_sampling_is_refused_in_training(tiny_model_dir: Path, tmp_path: Path) -> None:
    _refused(["train", "--model", str(tiny_model_dir), "--steps", "1", "--set", "rollout.top_p=0.9",
              "--set", "eval.size=2", *SMALL, "--out", str(tmp_path / "r")], TOP_P)
    assert not (tmp_path / "r").exists()
    assert load_config(sets=["rollout.top_p=1.0"]).rollout.top_p == 1.0


def test_k1_kl_in_the_loss_is_refused_unless_beta_is_zero(tiny_model_dir: Path, tmp_path: Path) -> None:
    _refused(["train", "--algo", "grpo", "--model", str(tiny_model_dir), "--steps", "1", "--set", "kl.estimator=k1",
              "--set", "eval.size=2", "--set", "rollout.num_generations=2", *SMALL, "--out", str(tmp_path / "r")],
             K1_LOSS)
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="regularises nothing"):
        load_config(overrides={"algo": "ppo", "kl.placement": "loss"})  # ppo's own k1, moved into the loss
    assert load_config(overrides={"algo": "grpo", "kl.estimator": "k1", "kl.beta": 0.0}).kl.beta == 0.0
    for estimator in ("k2", "k3"):
        assert load_config(overrides={"algo": "grpo", "kl.estimator": estimator}).kl.placement == "loss"


# --- 8, 9. rewards: what a reward function may return ----------------------------------------------

ROWS = [{"prompt": "1+1=", "answer": "2"}] * 2
COMPLETIONS = ["10", "2"]


def _returning(value: Any):
    def bad(prompts, completions, **columns):
        return value
    return bad


@pytest.mark.parametrize(("returned", "message"), [
    ({"a": 1.0, "b": 2.0}, "returned a dict, not a list of numbers."),  # was: its keys, then "not a number"
    ("10", "returned the str '10', not a list of numbers."),  # was: the characters as rewards [1.0, 0.0]
    (None, "returned None, not a list of numbers."),  # was: "raised TypeError"
    (["1", "2"], "returned the str '1' for completion 0, not a number."),  # was: float("1") = 1.0
    ([True, False], "returned a bool for completion 0, not a number."),  # was: 1.0, 0.0
    ([1.0, None], "returned None for completion 1, not a number."),
    (torch.ones(2, 1), "returned an array of shape (2, 1), not one number per completion."),
    ([float("nan"), 0.0], "returned NaN or infinity (nan for completion 0)."),
    ([1e39, 0.0], "returned 1e+39 for completion 0, beyond the float32 range (|r| ≤ 3.403e+38) rewards are "
                  "trained in; scale it down."),  # was: accepted, inf in float32
    ([0.0, 1e300], "returned 1e+300 for completion 1, beyond the float32 range (|r| ≤ 3.403e+38) rewards are "
                   "trained in; scale it down."),
])
def test_a_reward_that_returns_anything_but_numbers_is_named(returned: Any, message: str) -> None:
    with pytest.raises(RewardFailed) as info:
        score_texts(_returning(returned), ROWS, COMPLETIONS)
    assert str(info.value) == f"Reward function '_returning.<locals>.bad' {message}"


@pytest.mark.parametrize(("returned", "want"), [
    ([0.5, 1], [0.5, 1.0]), ((0.5, 1), [0.5, 1.0]), (torch.tensor([0.5, 1.0]), [0.5, 1.0]),
    (np.array([0.5, 1.0]), [0.5, 1.0]), ([np.float32(0.5), np.int64(1)], [0.5, 1.0]), ([torch.tensor(0.5), 1], [0.5, 1.0]),
    ([-3.4e38, 3.4e38], [-3.4e38, 3.4e38]),  # just inside float32's range (3.4028e38)
])
def test_sequences_arrays_and_numpy_numbers_are_rewards(returned: Any, want: list[float]) -> None:
    got = score_texts(_returning(returned), ROWS, COMPLETIONS)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    scale = max(abs(w) for w in want)  # compare relative to the largest reward: 3.4e38 → 1
    torch.testing.assert_close(got.double() / scale, torch.tensor(want, dtype=torch.float64) / scale, atol=1e-4, rtol=0)


def test_a_reward_that_calls_sys_exit_is_a_failure_not_an_exit() -> None:
    def quits(prompts, completions, **columns):
        sys.exit(0)
    with pytest.raises(RewardFailed, match=r"^Reward function '.*quits' called sys.exit\(0\).$"):
        score_texts(quits, ROWS, COMPLETIONS)


def test_a_weighted_sum_beyond_float32_names_its_terms() -> None:
    # 2 · 3e38 + 1 · 3e38 = 9e38 > 3.4028e38: each term fits in float32, their weighted sum does not
    reward = WeightedReward((Component("a", _returning([3e38, 1.0]), 2.0), Component("b", _returning([3e38, 1.0]), 1.0)))
    with pytest.raises(RewardFailed) as info:
        score_parts(reward, ROWS, COMPLETIONS)
    assert str(info.value) == ("The weighted reward Σ weight·r of completion 0 overflows float32 (a: 3e+38, b: 3e+38); "
                               "scale the terms or their weights down.")


BAD_REWARDS = '''
import sys

CALLS = [0]


def later(misbehave):
    """A reward that works for the evaluation before training and step 1, then misbehaves."""
    def reward(prompts, completions, **columns):
        CALLS[0] += 1
        if CALLS[0] <= 2:
            return [float(len(c)) for c in completions]
        return misbehave(completions)
    return reward


quits = later(lambda c: sys.exit(0))
quits3 = later(lambda c: sys.exit(3))
huge = later(lambda c: [1e39] * len(c))
nan = later(lambda c: [float("nan")] * len(c))
'''


@pytest.mark.parametrize(("name", "message"), [
    ("quits", "called sys.exit(0)."),  # was: exit 0, no summary, nothing printed
    ("quits3", "called sys.exit(3)."),  # was: exit 3, nothing printed
    ("huge", "returned 1e+39 for completion 0, beyond the float32 range"),  # was: skipped updates, blamed the loss
    ("nan", "returned NaN or infinity (nan for completion 0)."),
])
def test_a_misbehaving_reward_stops_the_real_cli_with_a_checkpoint(tiny_model_dir: Path, tmp_path: Path,
                                                                   name: str, message: str) -> None:
    reward_file = tmp_path / "bad_rewards.py"
    reward_file.write_text(BAD_REWARDS)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--reward", f"{reward_file}:{name}",
           "--steps", "3", "--out", str(out), "--set", "eval.size=4", "--set", "checkpoint.every=100", *SMALL]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"error: Reward function '{reward_file}:{name}' {message}"), err
    assert f"continue with: llmrl train --resume {out}" in err and "Traceback" not in proc.stdout + proc.stderr
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"] and not (out / "summary.json").exists()


# --- 8. the JSON files never hold NaN or Infinity; `llmrl advantages` never overflows -------------

def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_metrics_completions_and_summary_write_null_for_non_finite_numbers(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path / "run")
    folder.log_metrics({"step": 1, "actor_loss": float("nan"), "actor_grad_norm": float("inf"), "kl": 0.5})
    folder.log_completions([{"step": 1, "prompt": "p", "completion": "c", "reward": 1.0, "score": float("-inf")}])
    folder.write_summary({"kl_last": float("nan"), "runs": [1.0, float("inf")], "steps": 1})
    assert _strict((folder.path / "metrics.jsonl").read_text()) == {"step": 1, "actor_loss": None,
                                                                     "actor_grad_norm": None, "kl": 0.5}
    assert _strict((folder.path / "completions.jsonl").read_text())["score"] is None
    assert _strict((folder.path / "summary.json").read_text()) == {"kl_last": None, "runs": [1.0, None], "steps": 1}


def test_advantages_of_rewards_near_float32s_limit_are_exact() -> None:
    # grpo on ±3e38: mean 0, unbiased std = sqrt(2 · (3e38)² / 1) = 3e38·√2, A = ±1/√2 = ±0.707107
    # (float32 squared 3e38 into inf: advantages 0 and -0.0, exit 0)
    code, out, err = _cli(["advantages", "--algo", "grpo", "-i", "-", "--json"], input='{"scores": [3e38, -3e38]}')
    assert code == 0, err
    torch.testing.assert_close(torch.tensor(json.loads(out)["advantages"]), torch.tensor([[0.707107], [-0.707107]]),
                               atol=1e-4, rtol=0)
    # rloo on [3e38, 3e38, 1, 2]: A_1 = 3e38 − (3e38 + 1 + 2)/3 = 2e38 (to float64's 16 digits), A_3 = 1 − 2e38 …
    # (float32 summed 6e38 into inf: −Infinity everywhere)
    code, out, err = _cli(["advantages", "--algo", "rloo", "-i", "-", "--json"], input='{"scores": [3e38, 3e38, 1, 2]}')
    assert code == 0, err
    torch.testing.assert_close(torch.tensor(json.loads(out)["advantages"], dtype=torch.float64) / 1e38,
                               torch.tensor([[2.0], [2.0], [-2.0], [-2.0]], dtype=torch.float64), atol=1e-4, rtol=0)
    code, out, err = _cli(["advantages", "--algo", "grpo", "-i", "-"], input='{"scores": [1e39, 0]}')
    assert code == 2 and err.strip() == ("error: 'scores' must hold only finite numbers within float32's range "
                                         "(|x| ≤ 3.403e+38, like a training run's rewards)."), err


# --- 10. a causal LM is not a reward model ---------------------------------------------------------

def test_a_causal_lm_folder_is_refused_as_a_reward_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    message = (f"Reward model '{tiny_model_dir}' is a LlamaForCausalLM, not a sequence classifier: its checkpoint has "
               "no score.weight, so its score head would be random.")
    with pytest.raises(ConfigError) as info:
        RewardModel(str(tiny_model_dir), CPU)
    assert str(info.value) == message
    with pytest.raises(ConfigError, match="not a sequence classifier"):
        build_reward([{"model": str(tiny_model_dir)}], columns=set(), source="task", device=CPU)
    _refused(["train", "--model", str(tiny_model_dir), "--reward", str(tiny_model_dir), "--steps", "1",
              "--set", "eval.size=2", *SMALL, "--out", str(tmp_path / "r")], message)
    assert not (tmp_path / "r").exists()


# --- 11. generation stops on every end-of-turn id of the generation config -------------------------

def test_stop_token_ids_are_the_union_of_tokenizer_and_generation_config() -> None:
    tok = build_char_tokenizer()  # eos 2
    model = make_tiny_model()
    assert stop_token_ids(tok, model) == [2]  # generation_config.eos_token_id = 2 (from the config): no repeat
    model.generation_config.eos_token_id = [2, 7]
    assert stop_token_ids(tok, model) == [2, 7]
    model.generation_config.eos_token_id = 9
    assert stop_token_ids(tok, model) == [2, 9]
    model.generation_config.eos_token_id = None
    assert stop_token_ids(tok, model) == [2]


def test_decoding_stops_at_a_second_eos_id_of_the_generation_config() -> None:
    """A tiny model whose generation_config lists two eos ids, [</s>, X]: X is the token its greedy
    completion of '37+85=' emits first at position k (no </s> before); the completion ends there."""
    tok = build_char_tokenizer()
    model = make_tiny_model()
    stack = PolicyStack(model, LoraConfig(r=4), with_critic=False)
    rows = [{"prompt": "37+85="}, {"prompt": "1+2="}]
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], CPU)
    with stack.use("actor"):
        free = generate(stack, ids, mask, max_new_tokens=8, eos_id=-1, pad_id=tok.pad_token_id).response_ids[0].tolist()
    k = next(i for i, t in enumerate(free) if i >= 1 and t not in free[:i] and t != tok.eos_token_id)
    stop = free[k]
    assert tok.eos_token_id not in free[:k + 1] and k < 7
    model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    with stack.use("actor"):
        gen = generate(stack, ids, mask, max_new_tokens=8, eos_id=stop_token_ids(tok, stack.lm), pad_id=tok.pad_token_id)
    assert gen.response_mask[0].tolist()[:k + 1] == [True] * (k + 1) and not gen.response_mask[0, k + 1:].any()
    assert gen.response_ids[0, :k + 1].tolist() == free[:k + 1]  # the stop token is in the mask, then pad
    assert (gen.response_ids[0, k + 1:] == tok.pad_token_id).all()
    # evaluation (and the rollout) stop there too: the completion ends with X's character
    result = evaluate(build_engine("hf", stack=stack, tokenizer=tok), tok, rows, lambda p, c, **_: [0.0] * len(c), max_new_tokens=8)
    assert result.completions[0] == tok.decode(free[:k + 1], skip_special_tokens=True)


# --- 14. `llmrl eval` of a run without a held-out split -------------------------------------------

def test_eval_of_a_run_trained_with_eval_size_0_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, _, err = _cli(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(run),
                         "--set", "eval.size=0", *SMALL])
    assert code == 0, err
    _refused(["eval", "--model", str(run)],
             f"The run {run} (actor) was trained with eval.size=0, so it has no held-out prompts to score; pass "
             "--size N to score the first N of its 500 held-out rows, or --dataset FILE.")
    code, out, err = _cli(["eval", "--model", str(run), "--size", "3", "--samples", "0", "--json"])
    assert code == 0 and json.loads(out)["prompts"] == 3, err


def test_eval_of_a_dataset_run_without_a_held_out_split_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    run = tmp_path / "run"
    code, _, err = _cli(["train", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", "numeric",
                         "--steps", "1", "--out", str(run), "--set", "data.eval_fraction=0", *SMALL])
    assert code == 0, err
    _refused(["eval", "--model", str(run)],
             "Task 'sums' has no held-out split (data.eval_fraction is 0 and there is no data.eval_dataset); "
             "score a file with --dataset FILE.")
