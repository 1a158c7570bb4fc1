"""REINFORCE++ (both estimators), DAPO's overlong handling and the new presets (reinforce_pp,
reinforce_pp_baseline, gspo, dapo, cispo): hand-computed tables, the masked update, real CLI runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config
from llmrl.algos import preset_for
from llmrl.cli import app
from llmrl.config.on_policy import on_policy_update
from llmrl.run.checkpoint import trainable_state
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.forward import masked_logprobs
from llmrl.step.overlong import apply_overlong, overlong_penalty, truncated_rows
from llmrl.step.records import Forwards, Samples, Scores, StepPlan, Targets, TrainRows
from llmrl.step.update import make_optimizers, update
from llmrl.estimators import EstimatorInput, get_estimator
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import TASKS, get_task

from .conftest import make_tiny_model
from .helpers import close, digit_share, m, t
from .steps import rollout
from .helpers import digits_task as digits_task_factory

runner = CliRunner()
NEW = ("reinforce_pp", "reinforce_pp_baseline", "gspo", "dapo", "cispo")


def _batch(mask: list[list[int]], group_size: int = 1, ids: list[list[int]] | None = None) -> Samples:
    """Samples with only what the estimators and the overlong handling read (one-token prompts)."""
    response_mask = m(mask)
    n, width = response_mask.shape
    response_ids = torch.tensor(ids) if ids is not None else torch.ones(n, width, dtype=torch.long)
    return Samples(tuple({"prompt": ""} for _ in range(n // group_size)), torch.ones(n, 1, dtype=torch.long),
                   torch.ones(n, 1, dtype=torch.bool), response_ids, response_mask, group_size, torch.arange(n),
                   ("",) * n)


def _estimate(spec, samples: Samples, rewards: torch.Tensor, cfg) -> Targets:
    """`estimate` of given token rewards (no critic, no greedy baseline)."""
    return estimate(spec, samples, Scores(torch.zeros(samples.n)), Forwards(rewards.dtype), rewards, cfg)


# ---------------------------------------------------------------------------------------------
# REINFORCE++ estimators
# ---------------------------------------------------------------------------------------------


def test_reinforce_pp_return_carries_the_kl_still_ahead() -> None:
    # r = [−0.1, −0.2, 1 − 0.3]: the −β·KL_t of each token plus the score 1 on the last. γ = 1:
    # A_0 = 1 − (0.1 + 0.2 + 0.3) = 0.4, A_1 = 1 − 0.5 = 0.5, A_2 = 0.7 (paper eq. 8: r(y) − β Σ_{k≥t} KL_k).
    x = EstimatorInput(t([[-0.1, -0.2, 0.7]]), m([[1, 1, 1]]))
    close(get_estimator("reinforce_pp").fn(x).advantages, [[0.4, 0.5, 0.7]])


def test_reinforce_pp_preset_whitens_over_the_batch() -> None:
    # Rows r = [[0, 0, 1], [0, −0.5, ·]], γ = 1 → G = [[1, 1, 1], [−0.5, −0.5, ·]].
    # Over the 5 kept tokens: mean 2/5 = 0.4; deviations 0.6 (×3), −0.9 (×2); biased var (3·0.36 + 2·0.81)/5
    # = 0.54, std 0.734847 → 0.6/0.734847 = 0.816497 and −0.9/0.734847 = −1.224745; masked stays 0.
    cfg = load_config(overrides={"algo": "reinforce_pp"})
    assert cfg.estimator.whiten and cfg.estimator.name == "reinforce_pp"
    batch = _batch([[1, 1, 1], [1, 1, 0]])
    out = _estimate(get_estimator("reinforce_pp"), batch, t([[0, 0, 1], [0, -0.5, 0]]), cfg.estimator)
    close(out.advantages, [[0.816497, 0.816497, 0.816497], [-1.224745, -1.224745, 0.0]])


def test_reinforce_pp_baseline_is_group_mean_then_batch_std() -> None:
    # Groups [1, 0] and [1, 1] → centred [0.5, −0.5] and [0, 0] (no std division inside a group).
    x = EstimatorInput(t([[1.0], [0.0], [1.0], [1.0]]), m([[1], [1], [1], [1]]), group_size=2)
    out = get_estimator("reinforce_pp_baseline").fn(x)
    close(out.advantages, [[0.5], [-0.5], [0.0], [0.0]])
    assert out.stats["frac_zero_std_groups"] == 0.5
    # Batch whitening (the preset's): mean 0, biased var (0.25 + 0.25)/4 = 0.125, std 0.353553
    # → ±0.5/0.353553 = ±1.414214. GRPO divides by each group's std instead: ±0.5/0.707107 = ±0.707107.
    cfg = load_config(overrides={"algo": "reinforce_pp_baseline"})
    batch = _batch([[1], [1], [1], [1]], group_size=2)
    white = _estimate(get_estimator("reinforce_pp_baseline"), batch, x.token_rewards, cfg.estimator).advantages
    close(white, [[1.414214], [-1.414214], [0.0], [0.0]])
    close(get_estimator("grpo").fn(x).advantages, [[0.707107], [-0.707107], [0.0], [0.0]])


def test_reinforce_pp_baseline_whitening_weighs_tokens() -> None:
    # As verl and OpenRLHF, the statistics are over tokens: row 0 has 2 tokens. Centred values per token
    # [0.5, 0.5], [−0.5], [0], [0]: mean (1 − 0.5)/5 = 0.1; deviations 0.4, 0.4, −0.6, −0.1, −0.1; biased var
    # (0.32 + 0.36 + 0.02)/5 = 0.14, std 0.374166 → 1.069045, −1.603567, −0.267261.
    cfg = load_config(overrides={"algo": "reinforce_pp_baseline"})
    batch = _batch([[1, 1], [1, 0], [1, 0], [1, 0]], group_size=2)
    rewards = t([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    out = _estimate(get_estimator("reinforce_pp_baseline"), batch, rewards, cfg.estimator).advantages
    close(out, [[1.069045, 1.069045], [-1.603567, 0.0], [-0.267261, 0.0], [-0.267261, 0.0]])


def test_advantages_cli_whitens_on_request() -> None:
    # The whitening of the test above, through `llmrl advantages --whiten` (one-token rows).
    payload = json.dumps({"scores": [1, 0, 1, 1], "group_size": 2})
    args = ["advantages", "--algo", "reinforce_pp_baseline", "-i", "-", "--json"]
    plain = runner.invoke(app, args, input=payload)
    white = runner.invoke(app, [*args, "--whiten"], input=payload)
    assert json.loads(plain.stdout)["advantages"] == [[0.5], [-0.5], [0.0], [0.0]]
    close(t(json.loads(white.stdout)["advantages"]), [[1.414214], [-1.414214], [0.0], [0.0]])


# ---------------------------------------------------------------------------------------------
# DAPO's overlong handling
# ---------------------------------------------------------------------------------------------

PENALTY_TABLE = [
    # L_max = 10, buffer 0.2 → L_cache = 2, free up to 8 tokens: 7 → 0, 8 → 0, 9 → −(9 − 8)/2 = −0.5, 10 → −1.
    pytest.param(10, 0.2, 1.0, [7, 8, 9, 10], [0.0, 0.0, -0.5, -1.0], id="L10"),
    # Penalty factor 0.5 halves it: 9 → −0.25, 10 → −0.5.
    pytest.param(10, 0.2, 0.5, [9, 10], [-0.25, -0.5], id="factor"),
    # The built-in task (L_max = 5) with the dapo preset: L_cache = 1, free up to 4: 3 → 0, 4 → 0, 5 → −1.
    pytest.param(5, 0.2, 1.0, [3, 4, 5], [0.0, 0.0, -1.0], id="builtin"),
    # buffer 1: the whole range, −|y|/L_max: 2 of 4 → −0.5.
    pytest.param(4, 1.0, 1.0, [0, 2, 4], [0.0, -0.5, -1.0], id="whole-range"),
    # buffer 5e-324 (the smallest float the setting accepts): L_cache is 0 in float32, the limit is a step,
    # 0 below L_max and −1 at it (was: (4 − 4)/0 = NaN at |y| = 4, every update skipped; issue 44).
    pytest.param(4, 5e-324, 1.0, [0, 3, 4], [0.0, 0.0, -1.0], id="buffer-underflows"),
]


@pytest.mark.parametrize("max_new, buffer, factor, lengths, expected", PENALTY_TABLE)
def test_overlong_penalty_table(max_new, buffer, factor, lengths, expected) -> None:
    close(overlong_penalty(t(lengths), max_new, buffer, factor), expected)


EOS = 2


def test_truncated_rows_are_full_length_without_eos() -> None:
    # L_max = 3: row 0 full, last token 5 → truncated; row 1 full, ends with EOS → not; row 2 has 2 tokens → not.
    batch = _batch([[1, 1, 1], [1, 1, 1], [1, 1, 0]], ids=[[4, 4, 5], [4, 4, EOS], [4, EOS, 0]])
    assert truncated_rows(batch, EOS, 3).tolist() == [True, False, False]


def test_apply_overlong_adds_the_penalty_and_masks_truncated_rows() -> None:
    # L_max = 3, buffer 1/3 → L_cache = 1: only 3-token rows get −1. Rows as above, scores on the last token.
    cfg = load_config(overrides={"rollout.max_new_tokens": 3, "reward.overlong_buffer": 1 / 3,
                                 "update.mask_truncated": True})
    batch = _batch([[1, 1, 1], [1, 1, 1], [1, 1, 0]], ids=[[4, 4, 5], [4, 4, EOS], [4, EOS, 0]])
    rewards = t([[0, 0, 1], [0, 0, 1], [0, 1, 0]])
    shaped, trained, stats = apply_overlong(batch, rewards, cfg, EOS)
    close(shaped, [[0, 0, 0], [0, 0, 0], [0, 1, 0]])  # 1 − 1 on both 3-token rows
    assert trained.tolist() == [[False] * 3, [True] * 3, [True, True, False]]
    assert batch.response_mask[0].all()  # the estimators still see every row
    close(stats["truncated_frac"], 1 / 3)
    close(stats["overlong_penalty"], -2 / 3)


def test_overlong_handling_off_changes_nothing() -> None:
    cfg = load_config()
    batch, rewards = _batch([[1, 1]]), t([[0, 1]])
    shaped, trained, stats = apply_overlong(batch, rewards, cfg, EOS)
    assert shaped is rewards and trained is None and stats == {}


def _masked_fixture():
    """A real dapo rollout on a random tiny model (float64), 8 rows of which rows 0, 3, 5 end with EOS."""
    config = load_config(overrides={"algo": "dapo", "rollout.prompts_per_step": 2, "update.minibatch_size": 8,
                                    "update.lr_actor": 1e-2, "rollout.max_new_tokens": 3})
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), config.lora, with_critic=False, share_prompts=False)
    tok = build_char_tokenizer()
    rows = get_task("arithmetic").train[:2]
    plan = StepPlan(reference=False, critic=False, greedy=False)
    r = rollout(stack, tok, rows, torch.arange(2), cfg=config.rollout, plan=plan, reward_fn=digit_share,
                seed=0, step=0)
    ids = r.samples.response_ids.clone()
    ids[[0, 3, 5], -1] = tok.eos_token_id
    # every row 3 tokens long: those not ending with EOS are truncated
    samples = replace(r.samples, response_ids=ids, response_mask=torch.ones_like(r.samples.response_mask))
    with stack.use("actor"):
        old = masked_logprobs(stack, samples, 1.0)
    return config, stack, tok, samples, r.scores, Forwards(old.dtype, old)


def _update_weights(config, stack, batch, adv) -> dict[str, torch.Tensor]:
    initial = trainable_state(stack)
    update(stack, make_optimizers(stack, config.update), batch, Targets(torch.zeros_like(adv), adv), config.update, config.kl,
           0.0, 1.0, torch.Generator().manual_seed(1))
    after = {k: v.clone() for k, v in trainable_state(stack).items()}
    named = dict(stack.named_parameters())
    with torch.no_grad():
        for name, value in initial.items():
            named[name].copy_(value)
    return after


def test_masked_update_equals_the_update_on_the_finished_rows_alone() -> None:
    # token-mean over the batch: Σ over kept tokens / their count. With the truncated rows (1, 2, 4, 6, 7)
    # masked, the one optimizer step must equal that of the 3 finished rows alone (float64: 1e-9), and
    # the truncated rows' advantages must not matter at all.
    config, stack, tok, samples, scores, forwards = _masked_fixture()
    shaped, mask, stats = apply_overlong(samples, shape_rewards(samples, scores, forwards, 0.0, config.kl), config,
                                         tok.eos_token_id)
    assert stats["truncated_frac"] == 5 / 8
    batch = TrainRows.of(samples, forwards)
    trained = replace(batch, response_mask=mask)
    adv = torch.linspace(-1, 1, 8, dtype=torch.float64)[:, None].expand(8, 3).clone()
    masked = _update_weights(config, stack, trained, adv)
    junk = adv.clone()
    junk[[1, 2, 4, 6, 7]] = 1e3
    assert all(torch.equal(masked[k], v) for k, v in _update_weights(config, stack, trained, junk).items())
    keep = torch.tensor([0, 3, 5])
    alone_cfg = config.update.__class__(**{**config.update.__dict__, "minibatch_size": 3})
    alone = _update_weights(replace(config, update=alone_cfg), stack,
                            batch.select(keep), adv[keep])
    for k, v in alone.items():
        torch.testing.assert_close(masked[k], v, atol=1e-9, rtol=0)
    unmasked = _update_weights(config, stack, batch, adv)  # and the mask does change the step
    assert any((unmasked[k] - v).abs().max() > 1e-6 for k, v in masked.items())


def test_mask_truncated_with_a_kl_keeps_the_rollout_logprobs() -> None:
    # The on-policy shortcut would leave the truncated rows' log π_old at 0 (the update skips them),
    # which the logged KL reads: with β > 0 and mask_truncated the rollout computes them.
    one_pass = {"algo": "grpo", "rollout.prompts_per_step": 4, "update.minibatch_size": 16}
    assert on_policy_update(load_config(overrides=one_pass))
    assert not on_policy_update(load_config(overrides={**one_pass, "update.mask_truncated": True}))
    assert on_policy_update(load_config(overrides={**one_pass, "update.mask_truncated": True, "kl.beta": 0.0}))


# ---------------------------------------------------------------------------------------------
# presets, `llmrl algos`, real runs
# ---------------------------------------------------------------------------------------------

PRESETS = [
    pytest.param("reinforce_pp", {"estimator.name": "reinforce_pp", "kl.placement": "reward", "kl.estimator": "k1",
                                  "estimator.whiten": True}, id="reinforce_pp"),
    pytest.param("reinforce_pp_baseline", {"estimator.name": "reinforce_pp_baseline", "kl.placement": "loss",
                                           "kl.estimator": "k2", "estimator.whiten": True,
                                           "rollout.num_generations": 4}, id="reinforce_pp_baseline"),
    pytest.param("gspo", {"estimator.name": "grpo", "update.policy_loss": "gspo", "update.clip_eps": 3e-4,
                          "update.clip_eps_high": 4e-4, "update.loss_agg": "seq-mean-token-mean", "kl.beta": 0.0},
                 id="gspo"),
    pytest.param("dapo", {"estimator.name": "grpo", "update.policy_loss": "ppo", "update.clip_eps": 0.2,
                          "update.clip_eps_high": 0.28, "update.loss_agg": "token-mean", "kl.beta": 0.0,
                          "reward.overlong_buffer": 0.2, "update.mask_truncated": True}, id="dapo"),
    pytest.param("cispo", {"estimator.name": "grpo", "update.policy_loss": "cispo", "update.clip_eps": 1.0,
                           "update.clip_eps_high": 3.0, "update.loss_agg": "token-mean", "kl.beta": 0.0}, id="cispo"),
]


@pytest.mark.parametrize("algo, expected", PRESETS)
def test_presets_resolve_to_the_paper_settings(algo: str, expected: dict) -> None:
    cfg = load_config(overrides={"algo": algo})
    for key, value in expected.items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value, key
    # 512 rows per step, like every preset
    assert cfg.rollout.prompts_per_step * cfg.rollout.num_generations == 512


def test_grpo_preset_is_unchanged() -> None:
    # DeepSeekMath aggregates per sequence (seq-mean-token-mean); our grpo preset keeps token-mean (docs/algorithms.md).
    assert "update.loss_agg" not in preset_for("grpo") and load_config(overrides={"algo": "grpo"}).update.loss_agg == "token-mean"


def test_algos_lists_the_new_algorithms_and_their_losses() -> None:
    result = runner.invoke(app, ["algos"], env={"COLUMNS": "220"})
    assert result.exit_code == 0
    for text in (*NEW, "Hu et al. 2025 (REINFORCE++)", "Zheng et al. 2025 (GSPO)", "Yu et al. 2025 (DAPO)",
                 "MiniMax 2025", "group mean, then batch whitening", "cispo │", "gspo  │"):
        assert text in result.stdout, text


@pytest.fixture
def digits_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task 'digits': the arithmetic prompts with `digit_share` as reward (a random model earns it)."""
    monkeypatch.setitem(TASKS, "digits", digits_task_factory)


@pytest.mark.parametrize("algo", NEW)
def test_new_algorithm_trains_two_steps(algo: str, tiny_model_dir: Path, tmp_path: Path, digits_task: None) -> None:
    out = tmp_path / algo
    groups = [] if algo == "reinforce_pp" else ["--set", "rollout.num_generations=2"]
    result = runner.invoke(app, [
        "train", "--algo", algo, "--model", str(tiny_model_dir), "--task", "digits", "--steps", "2",
        "--out", str(out), "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4",
        "--set", "eval.size=4", *groups,
    ])
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["skipped_updates"] == 0 and r["actor_grad_norm"] > 0 for r in rows)
    if algo == "dapo":  # the overlong handling is logged
        assert {"truncated_frac", "overlong_penalty"} <= set(rows[0])
    else:
        assert "truncated_frac" not in rows[0]


@pytest.mark.parametrize(("value", "message"), [("0", "'reward.overlong_buffer' must be > 0, got 0.0."),
                                                ("1.5", "'reward.overlong_buffer' must be ≤ 1, got 1.5.")])
def test_overlong_buffer_out_of_range_exits_2(value: str, message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--set", f"reward.overlong_buffer={value}", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr
