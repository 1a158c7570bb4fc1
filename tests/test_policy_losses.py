"""The policy-loss registry (`update.policy_loss`) and its gspo and cispo entries: hand-computed
tables, the GSPO-token ↔ sequence-objective identity, and user losses through the real CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.errors import ConfigError
from llmrl.losses import (
    POLICY_LOSSES,
    cispo_loss,
    get_policy_loss,
    gspo_loss,
    policy_loss,
    register_policy_loss,
    resolve_policy_loss,
)

from .helpers import close, m, t

NAN = math.nan
runner = CliRunner()

# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


def test_builtins_are_registered_and_ppo_is_the_unchanged_function() -> None:
    assert {"ppo", "gspo", "cispo"} <= set(POLICY_LOSSES)
    assert get_policy_loss("ppo").fn is policy_loss  # the update calls the very function it called before
    assert get_policy_loss("gspo").fn is gspo_loss and get_policy_loss("cispo").fn is cispo_loss


def test_unknown_policy_loss_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="Unknown policy loss 'ppx'; valid policy losses: cispo, gspo, ppo"):
        get_policy_loss("ppx")


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo", formula="x")(policy_loss)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_dual_clip_is_refused_where_it_does_not_apply(name: str) -> None:
    with pytest.raises(ConfigError, match=f"update.dual_clip does not apply to the '{name}' policy loss"):
        resolve_policy_loss(name, None, 3.0)
    assert resolve_policy_loss("ppo", None, 3.0).name == "ppo"


# ---------------------------------------------------------------------------------------------
# gspo
# ---------------------------------------------------------------------------------------------

E05 = math.exp(0.05)  # 1.051271: the geometric mean of token ratios e^0.2 and e^−0.1


def _gspo_row(adv: float, **kw):
    # Row 0: two kept tokens with log ratios 0.2 and −0.1 (mean 0.05 → s = e^0.05), one masked junk token.
    old = t([[-1.0, -2.0, 0.0]])
    logprobs = torch.tensor([[-0.8, -2.1, 7.0]], requires_grad=True)
    out = gspo_loss(logprobs, old, t([[adv, adv, NAN]]), m([[1, 1, 0]]), **kw)
    (g,) = torch.autograd.grad(out.loss, logprobs)
    return out, g


GSPO_TABLE = [
    # Paper clip (3e-4, 4e-4), A = 1: s = 1.051271 > 1.0004 → max(−1.051271, −1.0004) = −1.0004, a constant:
    #   loss −1.0004 (both tokens carry it; per-row mean −1.0004), no gradient, every token clipped.
    pytest.param(1.0, {}, -1.0004, [0.0, 0.0, 0.0], 1.0, id="paper-clip-Apos-clipped"),
    # A = −1: max(1.051271, 1.0004) = 1.051271 unclipped. ∂s_it/∂logπ_it = s (GSPO-token), so
    #   ∂/∂logπ_t of (1/2)Σ_t s_t = s/2 = 0.525636 per token — which is also ∂s_i/∂logπ_t = s_i/|y_i|.
    pytest.param(-1.0, {}, E05, [E05 / 2, E05 / 2, 0.0], 0.0, id="paper-clip-Aneg-unclipped"),
    # Wide clip (0.2, 0.2), A = 1: s inside [0.8, 1.2] → −s = −1.051271, gradient −s/2 per token.
    pytest.param(1.0, {"clip_low": 0.2, "clip_high": 0.2}, -E05, [-E05 / 2, -E05 / 2, 0.0], 0.0, id="wide-clip"),
]


@pytest.mark.parametrize("adv, kw, loss, grad, clip_frac", GSPO_TABLE)
def test_gspo_table(adv, kw, loss, grad, clip_frac) -> None:
    out, g = _gspo_row(adv, **kw)
    close(out.loss, loss)
    close(g, [grad])
    close(out.clip_frac, clip_frac)


def test_gspo_aggregation_is_per_sequence_by_default() -> None:
    # Row 0 as above with A = −1 (ℓ = 1.051271 on both tokens); row 1: one token, log ratio 0 (s = 1), A = 2 → −2.
    # seq-mean-token-mean (the default, verl's): (1.051271 + (−2))/2 = −0.474364;
    # token-mean: (2·1.051271 − 2)/3 = 0.034181 (the long row would weigh twice).
    old = t([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    logprobs = t([[-0.8, -2.1, 7.0], [-1.0, 3.0, 3.0]])
    adv, mask = t([[-1.0, -1.0, NAN], [2.0, NAN, NAN]]), m([[1, 1, 0], [1, 0, 0]])
    close(gspo_loss(logprobs, old, adv, mask).loss, (E05 - 2) / 2)
    close(gspo_loss(logprobs, old, adv, mask, agg="token-mean").loss, (2 * E05 - 2) / 3)


def test_gspo_token_gradient_is_the_sequence_objectives() -> None:
    # With a wide clip (nothing clipped), A_it = A_i and seq-mean-token-mean, the GSPO-token loss has the
    # gradient of GSPO's sequence objective −mean_i A_i s_i, s_i = exp(mean_t log ρ_it), on random inputs.
    gen = torch.Generator().manual_seed(3)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 2, 3, 1])[:, None]
    old = -torch.rand(4, 5, generator=gen)
    logprobs = (old + 0.05 * torch.randn(4, 5, generator=gen)).requires_grad_(True)
    a = torch.randn(4, generator=gen)
    adv = torch.where(mask, a[:, None].expand(4, 5), torch.zeros(4, 5))
    token = gspo_loss(logprobs, old, adv, mask, clip_low=10.0, clip_high=10.0).loss
    (g_token,) = torch.autograd.grad(token, logprobs)
    seq_ratio = torch.exp(torch.where(mask, logprobs - old, 0.0).sum(-1) / mask.sum(-1))
    (g_seq,) = torch.autograd.grad(-(a * seq_ratio).mean(), logprobs)
    close(g_token, g_seq.tolist())


# ---------------------------------------------------------------------------------------------
# cispo
# ---------------------------------------------------------------------------------------------

CISPO_TABLE = [
    # Paper-style bounds ε_low = 1 (no lower bound), ε_high = 3 (weight ≤ 4). ρ = 1.5, A = 1: w = 1.5,
    #   log π = −1 + ln 1.5 = −0.594535 → ℓ = −1.5·1·(−0.594535) = 0.891802; ∂ℓ/∂logπ = −w·A = −1.5.
    pytest.param(1.5, 1.0, 1.0, 3.0, 0.891802, -1.5, 0.0, id="inside"),
    # ρ = 5 > 4: w = 4 (clipped), log π = −1 + ln 5 = 0.609438 → ℓ = −4·0.609438 = −2.437752; the gradient
    #   −w·A = −4 survives the clip (PPO's would be 0).
    pytest.param(5.0, 1.0, 1.0, 3.0, -2.437752, -4.0, 1.0, id="above-cap-keeps-gradient"),
    # No lower bound: ρ = 0.01, A = −1: w = 0.01, log π = −1 + ln 0.01 = −5.605170 → ℓ = −0.01·(−1)·(−5.605170)
    #   = −0.056052; gradient −w·A = 0.01.
    pytest.param(0.01, -1.0, 1.0, 3.0, -0.056052, 0.01, 0.0, id="no-lower-bound"),
    # Bounds 0.2/0.2: ρ = 1.5 → w = 1.2: ℓ = −1.2·(−0.594535) = 0.713442, gradient −1.2.
    pytest.param(1.5, 1.0, 0.2, 0.2, 0.713442, -1.2, 1.0, id="narrow-above"),
    # ρ = 0.5, A = −1 → w = 0.8: log π = −1 + ln 0.5 = −1.693147 → ℓ = −0.8·(−1)·(−1.693147) = −1.354518, gradient 0.8.
    pytest.param(0.5, -1.0, 0.2, 0.2, -1.354518, 0.8, 1.0, id="narrow-below"),
]


@pytest.mark.parametrize("ratio, adv, low, high, loss, grad, clip_frac", CISPO_TABLE)
def test_cispo_table(ratio, adv, low, high, loss, grad, clip_frac) -> None:
    # One kept token (log π_old = −1, log π = −1 + ln ρ) and one masked token holding junk.
    logprobs = torch.tensor([[-1.0 + math.log(ratio), NAN]], requires_grad=True)
    out = cispo_loss(logprobs, t([[-1.0, 0.0]]), t([[adv, NAN]]), m([[1, 0]]), clip_low=low, clip_high=high)
    close(out.loss, loss)
    (g,) = torch.autograd.grad(out.loss, logprobs)
    close(g, [[grad, 0.0]])
    close(out.clip_frac, clip_frac)


def test_cispo_gradient_at_ratio_one_is_reinforce() -> None:
    # ρ = 1 ⇒ w = 1: ∇ℓ = −A ∇log π, the same gradient as PPO's surrogate at ρ = 1 (token-mean over 3 tokens).
    old = t([[-1.0, -2.0], [-0.5, 0.0]])
    adv, mask = t([[1.0, -2.0], [3.0, 0.0]]), m([[1, 1], [1, 0]])
    grads = []
    for fn in (cispo_loss, policy_loss):
        lp = old.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(fn(lp, old, adv, mask, 0.2, 0.2).loss, lp)[0])
    close(grads[0], [[-1 / 3, 2 / 3], [-1.0, 0.0]])
    close(grads[0], grads[1].tolist())


# ---------------------------------------------------------------------------------------------
# through the CLI: a user's loss, bad names and modules
# ---------------------------------------------------------------------------------------------

SMALL = ["--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4"]


def test_user_policy_loss_module_trains(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_losses.py").write_text(
        "from llmrl.losses import PolicyLoss, register_policy_loss\n"
        "from llmrl.ops import masked_mean\n"
        "CALLS = []\n"
        "@register_policy_loss('plain_pg', formula='−A·log π')\n"
        "def plain_pg(lp, old, adv, mask, clip_low, clip_high, dual_clip, agg, **totals):\n"
        "    CALLS.append(lp.shape)\n"
        "    loss = masked_mean(-adv * lp, mask)\n"
        "    return PolicyLoss(loss, loss.detach() * 0, loss.detach() * 0 + 7.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    try:
        result = runner.invoke(app, [
            "train", "--algo", "reinforce", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out),
            "--set", "update.policy_loss_module=my_losses", "--set", "update.policy_loss=plain_pg", *SMALL,
        ])
        assert result.exit_code == 0, result.stderr
        assert sys.modules["my_losses"].CALLS  # the update called the user's loss ...
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert row["approx_kl"] == pytest.approx(7.0)  # ... and logged what it returned
        listing = runner.invoke(app, ["losses"], env={"COLUMNS": "200"})
        assert "plain_pg" in listing.stdout and "−A·log π" in listing.stdout
    finally:
        POLICY_LOSSES.pop("plain_pg", None)
        sys.modules.pop("my_losses", None)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--set", "update.policy_loss=ppx"], "Unknown policy loss 'ppx'; valid policy losses: cispo, gspo, ppo."),
        (["--set", "update.policy_loss_module=no_such_loss_mod"], "Cannot import policy-loss module 'no_such_loss_mod'"),
        (["--algo", "gspo", "--set", "update.dual_clip=3"], "update.dual_clip does not apply to the 'gspo' policy loss"),
    ],
)
def test_bad_policy_loss_settings_exit_2(overrides: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", *overrides, "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_losses_lists_the_builtins() -> None:
    result = runner.invoke(app, ["losses"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("ppo", "gspo", "cispo", "Zheng et al. 2025", "s_i = exp(mean_t log ρ_t)", "−sg(clip(ρ_t"):
        assert name in result.stdout
