"""Speed switches must not change the numbers they claim to keep.

`update.on_policy_logprobs` ('auto' by default): with one epoch of one minibatch and no KL in the
reward the update is exactly on-policy, so log π_old equals the detached log-probs of the update's
own forward. Skipping the rollout's no-grad forward must give the same old log-probs, the same
losses and the same adapter weights (float64: only summation order may differ, so 1e-10), and the
KL logged from them after the update. 'auto' turns it on exactly then (and never for the default
ppo run), 'on' refuses anything else, 'off' never; old run folders' true/false still load.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.dist_plugin  # noqa: F401  (registers the dist_digits task: a dense reward for a random model)
from llmrl import load_config, read_run, train
from llmrl.algos import ALGOS
from llmrl.run.checkpoint import trainable_state
from llmrl.config.on_policy import exactly_on_policy, on_policy_update
from llmrl.step import forward as rollout_mod
from llmrl.step.estimate import estimate, sequence_kl, shape_rewards
from llmrl.step.records import StepPlan
from llmrl.run.session import resolve_estimator
from llmrl.step.update import make_optimizers, update
from llmrl.errors import ConfigError
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import get_task
from tests.helpers import digit_share as _digit_share, is_timing
from tests.conftest import make_tiny_model
from tests.steps import rollout

ROOT = Path(__file__).resolve().parent.parent
# grpo, 2 prompts × 4 samples in one minibatch, KL (k3) in the loss: exactly on-policy
ELIGIBLE = {"algo": "grpo", "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "update.minibatch_size": 8}


def _step(fast: bool, micro: int | None):
    """One rollout + update of grpo (2 prompts × 4, KL k3 in the loss) on a fresh float64 tiny model:
    (old log-probs before the update (None: skipped), the old log-probs the step ends with, the
    rollout, update stats, trainable weights)."""
    config = load_config(overrides={"algo": "grpo", "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
                                    "update.minibatch_size": 8, "update.micro_batch_size": micro,
                                    "update.lr_actor": 1e-2, "kl.beta": 0.04, "update.on_policy_logprobs": fast})
    assert on_policy_update(config) is fast  # the old boolean values: true → 'on', false → 'off'
    spec = resolve_estimator(config)
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), config.lora, with_critic=False)
    with torch.no_grad():  # an actor that differs from the reference, so the KL terms are not 0
        for p in stack.parameters_of("actor"):
            p.add_(0.3 * torch.randn_like(p))
    initial = {k: v.clone() for k, v in trainable_state(stack).items()}
    rows = get_task("arithmetic").train[:2]
    plan = StepPlan(reference=True, critic=False, greedy=False, old_logprobs=not fast)
    r = rollout(stack, build_char_tokenizer(), rows, torch.arange(2), cfg=config.rollout, plan=plan,
                reward_fn=_digit_share, seed=0, step=0)
    before = r.forwards.old_logprobs
    targets = estimate(spec, *r, shape_rewards(*r, config.kl.beta, config.kl), config.estimator)
    result = update(stack, make_optimizers(stack, config.update), r.rows, targets,
                    config.update, config.kl, config.kl.beta, config.rollout.temperature, torch.Generator().manual_seed(7),
                    on_policy=fast)
    weights = trainable_state(stack)
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 1e-3  # the update moved them
    old = before if before is not None else result.old_logprobs
    return before, old, r, result.stats, weights


@pytest.mark.parametrize("micro", [None, 3])
def test_on_policy_logprobs_keep_the_update_exact(micro: int | None) -> None:
    slow_before, slow_old, slow, slow_stats, slow_w = _step(False, micro)
    fast_before, fast_old, fast, fast_stats, fast_w = _step(True, micro)
    assert slow_before.abs().max() > 0.1 and fast_before is None  # the fast rollout skipped the forward
    mask = slow.samples.response_mask
    assert mask.sum() > 8 and torch.equal(mask, fast.samples.response_mask)
    torch.testing.assert_close(fast_old, slow_old, atol=1e-10, rtol=0)
    kl_fast = sequence_kl(fast_old, fast.forwards.ref_logprobs, mask)
    kl_slow = sequence_kl(slow_old, slow.forwards.ref_logprobs, mask)
    assert kl_fast == pytest.approx(kl_slow, abs=1e-10) and abs(kl_slow) > 1e-3
    for key in ("policy_loss", "entropy", "clip_frac", "approx_kl", "actor_grad_norm"):
        assert fast_stats[key] == pytest.approx(slow_stats[key], abs=1e-10), key
    assert fast_w.keys() == slow_w.keys()
    for name in slow_w:
        torch.testing.assert_close(fast_w[name], slow_w[name], atol=1e-10, rtol=0)


RULES = [  # each breaks one condition of an exactly on-policy update
    {"update.epochs": 2},
    {"update.minibatch_size": 4},
    {"kl.placement": "reward", "kl.beta": 0.1},
]


def test_auto_is_on_exactly_for_an_on_policy_update() -> None:
    config = load_config(overrides=ELIGIBLE)
    assert config.update.on_policy_logprobs == "auto" and on_policy_update(config)
    for sets in RULES:
        config = load_config(overrides={**ELIGIBLE, **sets})
        assert not exactly_on_policy(config) and not on_policy_update(config), sets
    # a KL that is not in the reward does not need log π_old before the update
    for sets in ({"kl.placement": "reward", "kl.beta": 0.0}, {"kl.placement": "loss", "kl.beta": 0.5}):
        assert on_policy_update(load_config(overrides={**ELIGIBLE, **sets})), sets
    assert not on_policy_update(load_config(overrides={**ELIGIBLE, "update.on_policy_logprobs": "off"}))
    assert on_policy_update(load_config(overrides={**ELIGIBLE, "update.on_policy_logprobs": "on"}))


def test_the_default_ppo_run_keeps_its_rollout_forward() -> None:
    """`llmrl train` with no options: epochs 1, but two minibatches of 256 of the 512 rows and a k1
    KL in the reward (β = 0.02): off on two counts, so its numbers cannot change."""
    config = load_config()
    assert (config.algo, config.update.epochs, config.update.minibatch_size) == ("ppo", 1, 256)
    assert config.rollout.prompts_per_step * config.rollout.num_generations == 512
    assert (config.kl.placement, config.kl.beta) == ("reward", 0.02)
    assert config.update.on_policy_logprobs == "auto" and not on_policy_update(config)
    assert not on_policy_update(load_config(overrides={"update.minibatch_size": 512}))  # the KL alone keeps it off
    assert not on_policy_update(load_config(overrides={"kl.beta": 0.0}))  # the minibatches alone keep it off
    assert on_policy_update(load_config(overrides={"update.minibatch_size": 512, "kl.beta": 0.0}))


def test_no_preset_is_on_by_default_and_which_become_so_with_one_minibatch() -> None:
    """Every preset splits its 512 rows into two minibatches of 256, so 'auto' is off for all of
    them; with one minibatch of 512 the presets whose KL is in the loss (or β = 0) turn it on."""
    assert not [name for name in ALGOS if on_policy_update(load_config(overrides={"algo": name}))]
    one = [name for name in ALGOS if on_policy_update(load_config(overrides={"algo": name, "update.minibatch_size": 512}))]
    assert one == ["grpo", "dr_grpo", "reinforce_pp_baseline", "gspo", "dapo", "cispo"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "llmrl", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


@pytest.mark.parametrize("sets", [
    {"update.epochs": 2},
    {"update.minibatch_size": 4},
    {"kl.placement": "reward", "kl.beta": 0.1},
])
def test_on_policy_logprobs_refuses_an_off_policy_update(sets: dict) -> None:
    for on in ("on", True):
        base = {**ELIGIBLE, "update.on_policy_logprobs": on}
        load_config(overrides=base)  # the on-policy case is accepted
        with pytest.raises(ConfigError, match="needs one exactly on-policy update"):
            load_config(overrides={**base, **sets})
    for other in ("auto", "off", False):  # these never refuse
        load_config(overrides={**ELIGIBLE, **sets, "update.on_policy_logprobs": other})


@pytest.mark.parametrize("value", ["on", "true"])
def test_on_policy_logprobs_cli_error(tmp_path: Path, value: str) -> None:
    result = _cli("train", "--set", f"update.on_policy_logprobs={value}", "--set", "update.epochs=2",
                  "--out", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: 'update.on_policy_logprobs' needs one exactly on-policy update: update.epochs=1, "
        "update.minibatch_size=512 (all rows of a step) and no KL in the reward (kl.placement=loss or kl.beta=0).")
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "r").exists()


def test_config_lists_the_choices_and_reads_yaml_booleans(tmp_path: Path) -> None:
    listing = _cli("config", "--yaml", "--set", "update.on_policy_logprobs=off", "--set", "data.chat_template=on")
    assert listing.returncode == 0, listing.stderr
    assert "on_policy_logprobs: 'off'" in listing.stdout and "chat_template: 'on'" in listing.stdout
    table = _cli("config")
    assert table.returncode == 0 and "'auto': whenever the" in table.stdout and "'off': never" in table.stdout
    bad = _cli("config", "--set", "update.on_policy_logprobs=sometimes")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: 'update.on_policy_logprobs' must be one of auto, on, off; got 'sometimes'."
    # a recipe or an old run folder's config.yaml: true/false (and YAML's on/off) as well as the words
    for text, value in (("false", "off"), ("true", "on"), ("off", "off"), ("'on'", "on"), ("auto", "auto")):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"algo: grpo\nrollout: {{prompts_per_step: 2, num_generations: 4}}\n"
                          f"update: {{minibatch_size: 8, on_policy_logprobs: {text}}}\n")
        assert load_config(recipe).update.on_policy_logprobs == value, text
    recipe.write_text("data:\n  chat_template: off\n")  # the README's example: YAML reads `off` as false
    assert load_config(recipe).data.chat_template == "off"


def _counted_run(monkeypatch: pytest.MonkeyPatch, config, resume: bool = False) -> list[str]:
    """Train `config`; the roles of the rollout's no-grad forwards, in order (the real
    `masked_logprobs`, wrapped)."""
    real, roles = rollout_mod.masked_logprobs, []

    def counted(stack, batch, temperature):
        roles.append(stack.role)
        return real(stack, batch, temperature)

    with monkeypatch.context() as m:
        m.setattr(rollout_mod, "masked_logprobs", counted)
        train(config, resume=resume)
    return roles


def _tiny(model: Path, out: Path, **sets) -> dict:
    """The eligible grpo shape on the random tiny model with a dense reward, 2 steps, no eval."""
    return {**ELIGIBLE, "model.name": str(model), "task": "dist_digits", "estimator.module": "tests.dist_plugin",
            "steps": 2, "out": str(out), "eval.size": 0, "lora.r": 4, "lora.alpha": 4, "update.lr_actor": 1e-2,
            # the other way to skip the actor forward (tests/test_generation_logprobs.py) is off here
            "rollout.generation_logprobs": False, **sets}


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in read_run(run).metrics]


def test_auto_skips_the_rollout_actor_forward_end_to_end(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    off = load_config(overrides=_tiny(tiny_model_dir, tmp_path / "off", **{"update.on_policy_logprobs": "off"}))
    auto = load_config(overrides=_tiny(tiny_model_dir, tmp_path / "auto"))
    assert _counted_run(monkeypatch, off) == ["actor", "reference"] * 2
    assert _counted_run(monkeypatch, auto) == ["reference"] * 2
    off, auto = read_run(tmp_path / "off").metrics, read_run(tmp_path / "auto").metrics
    assert [r["step"] for r in auto] == [1, 2] and 0 < off[0]["reward_mean"] < 1
    for a, b in zip(off, auto):  # the same samples; losses, KL and gradient norms up to float32 rounding
        for key, value in a.items():
            if is_timing(key):
                continue
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, abs=1e-5, rel=1e-4), key
            else:
                assert b[key] == value, key
    assert abs(off[1]["kl"]) > 1e-3 and off[1]["actor_grad_norm"] > 1e-2  # the compared numbers are not 0


def test_an_old_run_folder_with_false_resumes_as_it_was_trained(monkeypatch: pytest.MonkeyPatch,
                                                                 tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run folder written before the setting had three values holds `on_policy_logprobs: false`:
    `--resume` (load_config of the folder's config.yaml, as the CLI does) reads it as 'off', not
    'auto' (which would turn this eligible run on), and continues bit-identically to an
    uninterrupted 'off' run, with the rollout's actor forward."""
    off = {"update.on_policy_logprobs": False}
    train(load_config(overrides=_tiny(tiny_model_dir, tmp_path / "full", steps=4, **off)))
    train(load_config(overrides=_tiny(tiny_model_dir, tmp_path / "old", **off)))
    saved = tmp_path / "old" / "config.yaml"
    assert "on_policy_logprobs: 'off'" in saved.read_text()
    saved.write_text(saved.read_text().replace("on_policy_logprobs: 'off'", "on_policy_logprobs: false"))
    config = load_config(saved, {"out": str(tmp_path / "old"), "steps": 4})
    assert config.update.on_policy_logprobs == "off" and exactly_on_policy(config)
    assert _counted_run(monkeypatch, config, resume=True) == ["actor", "reference"] * 2  # steps 3 and 4
    assert _rows(tmp_path / "old") == _rows(tmp_path / "full") and len(_rows(tmp_path / "full")) == 4
