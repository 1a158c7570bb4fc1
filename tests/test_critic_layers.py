"""`lora.critic_layers`: a critic adapter on the top k decoder layers, run from layer L−k.

The critic has no adapter below layer L−k, so its hidden state there is the frozen base's; the
shortcut starts its forward from that state (kept from the reference forward, or a no-grad base
forward) and runs only the top k layers. It must give the values and gradients of a full forward of
the same critic (float64: 1e-10 / 1e-8), leave the actor's numbers alone, resume bit for bit, and
change nothing when unset.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import tests.dist_plugin  # noqa: F401  (registers the dist_digits task: a dense reward for a random model)
from llmrl import load_config, read_run, train
from llmrl.run.checkpoint import trainable_state
from llmrl.config.on_policy import on_policy_values
from llmrl.config.schema import LoraConfig
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.records import StepPlan
from llmrl.run.session import resolve_estimator
from llmrl.step.update import make_optimizers, update
from llmrl.parallel.distributed import SINGLE
from llmrl.errors import ConfigError
from llmrl.models.stack import PolicyStack, layout
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.models.top_layers import decoder_layers
from llmrl.tasks import get_task
from tests.helpers import digit_share, is_timing
from tests.steps import rollout

ROOT = Path(__file__).resolve().parent.parent
TOK = build_char_tokenizer()


def _llama(layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(TOK), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                      pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id)
    return LlamaForCausalLM(cfg).eval().to(torch.float64)


def _gpt2(layers: int = 3) -> GPT2LMHeadModel:
    """GPT-2 adds position embeddings to the token embeddings before its layers."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=layers, n_head=4, n_positions=64,
                     pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id)
    return GPT2LMHeadModel(cfg).eval().to(torch.float64)


MODELS = {"llama": (_llama, ["norm"]), "gpt2": (_gpt2, ["ln_f", "ln_2"])}


def _stack(name: str, k: int | None, share: bool = True) -> PolicyStack:
    """A float64 stack whose critic adapter and value head are random (not the identity at init)."""
    build, saved = MODELS[name]
    stack = PolicyStack(build(), LoraConfig(r=4, alpha=4.0, critic_layers=k, modules_to_save=saved),
                        with_critic=True, share_prompts=share)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in stack.parameters_of("critic"):
            p.add_(0.3 * torch.randn_like(p))
    return stack


def _seq(groups: int = 2, g: int = 3):
    """Left-padded prompts, G samples each (so prompt sharing is used), right-padded responses."""
    torch.manual_seed(2)
    n, p, t = groups * g, 6, 5
    prompt_ids = torch.randint(3, len(TOK), (groups, p)).repeat_interleave(g, 0)
    prompt_mask = torch.ones(groups, p, dtype=torch.bool)
    prompt_mask[0, :2] = False  # left padding
    prompt_mask = prompt_mask.repeat_interleave(g, 0)
    prompt_ids = torch.where(prompt_mask, prompt_ids, TOK.pad_token_id)
    response_ids = torch.randint(3, len(TOK), (n, t))
    response_mask = torch.arange(t).expand(n, t) < torch.tensor([5, 3, 1, 4, 5, 2])[:n, None]
    response_ids = torch.where(response_mask, response_ids, TOK.pad_token_id)
    return layout(prompt_ids, prompt_mask, response_ids, response_mask), response_mask


def _calls_below(stack: PolicyStack) -> list[int]:
    """A call counter on the first linear module of every layer below L−k."""
    counts: list[int] = []
    for i, layer in enumerate(decoder_layers(stack.lm)[1][: stack.critic_start]):
        counts.append(0)
        linear = next(m for m in layer.modules() if hasattr(m, "base_layer"))
        linear.register_forward_hook(lambda *_a, i=i: counts.__setitem__(i, counts[i] + 1))
    return counts


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("share", [True, False])
def test_the_shortcut_gives_the_full_forwards_values_and_gradients(name: str, share: bool) -> None:
    stack = _stack(name, 2, share)
    layers = len(decoder_layers(stack.lm)[1])
    assert stack.critic_start == layers - 2 and stack.critic_shortcut
    seq, mask = _seq()
    weights = torch.randn(mask.shape, dtype=torch.float64)
    params = stack.parameters_of("critic")
    with stack.use("critic"):  # (its parameters require grad only in its context)
        full = stack.values(seq)
        expected = torch.autograd.grad((full * weights * mask).sum(), params)
    assert min(float(g.abs().max()) for g in expected) > 1e-4  # every critic parameter gets a gradient
    kept: list[torch.Tensor] = []
    with torch.no_grad(), stack.use("reference"), stack.keeping_base(kept):
        stack.hidden(seq)  # the reference forward of a rollout (shared prompts when `share`)
    assert len(kept) == 1 and kept[0].shape == (*seq.ids.shape, 32) and not kept[0].requires_grad
    bases = {"kept": kept[0], "base forward": stack.base_hidden(seq)}
    torch.testing.assert_close(bases["kept"], bases["base forward"], atol=1e-12, rtol=0)
    counts = _calls_below(stack)
    for label, base in bases.items():
        with stack.use("critic"):
            short = stack.values(seq, base)
            grads = torch.autograd.grad((short * weights * mask).sum(), params)
        assert full[mask].abs().max() > 0.1
        torch.testing.assert_close(short[mask], full[mask], atol=1e-10, rtol=0, msg=label)
        for got, want in zip(grads, expected):
            # the full forward of shared prompts adds the G copies of a prompt position before, the
            # shortcut (one plain forward of the top layers) after, Llama's RMS norms, which
            # transformers computes in float32 even in a float64 model (see test_prefix.py)
            tol = 1e-6 * float(want.abs().max()) if share and name == "llama" else 1e-8
            torch.testing.assert_close(got, want, atol=tol, rtol=0, msg=label)
    assert counts == [0] * (layers - 2)  # the layers below L−k never ran with the critic


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_critic_adapter_lives_on_the_top_layers_only(name: str) -> None:
    stack = _stack(name, 1)
    prefix, layers = decoder_layers(stack.lm)
    top = f"{prefix}.{len(layers) - 1}."
    critic = [n for n, _ in stack.lm.named_parameters() if ".critic." in n or n.endswith(".critic")]
    actor = [n for n, _ in stack.lm.named_parameters() if ".actor." in n]
    lora = lambda names: {n for n in names if "lora_" in n}  # noqa: E731
    assert lora(critic) and all(n.startswith(top) for n in lora(critic))
    assert len(lora(critic)) * len(layers) == len(lora(actor))  # the actor's modules, in the top layer only
    saved = stack.peft.peft_config["critic"].modules_to_save
    assert saved and all(n.startswith(top) or not n.startswith(prefix + ".") for n in saved)  # + the final norm


def test_no_critic_layers_and_all_layers_are_todays_critic() -> None:
    plain, every = _stack("llama", None), _stack("llama", 4)
    assert plain.critic_start == every.critic_start == 0 and not plain.critic_shortcut and not every.critic_shortcut
    a, b = dict(plain.named_parameters()), dict(every.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    seq, _ = _seq()
    with plain.use("critic"), every.use("critic"):
        assert torch.equal(plain.values(seq), every.values(seq))


def test_refusals() -> None:
    with pytest.raises(ConfigError, match=r"'lora.critic_layers' \(5\) exceeds the model's 4 decoder layers"):
        PolicyStack(_llama(), LoraConfig(critic_layers=5), with_critic=True)
    with pytest.raises(ConfigError, match="embedding in 'lora.modules_to_save'"):
        PolicyStack(_llama(), LoraConfig(critic_layers=2, modules_to_save=["embed_tokens"]), with_critic=True)
    with pytest.raises(ConfigError, match="'dist.shard_base' does not support"):
        from llmrl.parallel.fsdp import shard_base

        shard_base(_stack("llama", 2), SINGLE)
    # algorithms without a critic ignore it
    assert PolicyStack(_llama(), LoraConfig(critic_layers=5), with_critic=False).critic_start == 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "llmrl", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("k, message", [("0", "'lora.critic_layers' must be ≥ 1, got 0."),
                                        ("3", "'lora.critic_layers' (3) exceeds the model's 2 decoder layers.")])
def test_cli_refuses_a_bad_layer_count(tiny_model_dir: Path, tmp_path: Path, k: str, message: str) -> None:
    out = _cli("train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r"), "--steps", "1",
               "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4",
               "--set", f"lora.critic_layers={k}")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"error: {message}" and "Traceback" not in out.stderr


def _config(model: Path, out: Path, **sets) -> dict:
    """ppo (GAE critic, β = 0.02) on the random 2-layer tiny model with a dense reward, no eval."""
    return {"algo": "ppo", "model.name": str(model), "task": "dist_digits", "estimator.module": "tests.dist_plugin",
            "rollout.prompts_per_step": 8, "update.minibatch_size": 4, "steps": 2, "out": str(out), "eval.size": 0,
            "lora.r": 4, "lora.alpha": 4.0, "update.lr_actor": 1e-2, "update.lr_critic": 1e-2, **sets}


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in read_run(run).metrics]


def _weights(run: Path, role: str) -> dict[str, torch.Tensor]:
    return load_file(run / "adapters" / role / "adapter_model.safetensors")


PLANS = {"reference-forward": {}, "base-forward": {"kl.beta": 0.0}, "on-policy-values": {"update.minibatch_size": 8}}


def _ppo_step(shortcut: bool, sets: dict):
    """One ppo rollout + update (8 prompts, minibatches of 4) of a float64 4-layer Llama whose critic
    sits on its top 2 layers: (values of the rollout, update stats, trainable weights)."""
    config = load_config(overrides={"algo": "ppo", "rollout.prompts_per_step": 8, "update.minibatch_size": 4,
                                    "lora.r": 4, "lora.alpha": 4.0, "lora.critic_layers": 2,
                                    "lora.critic_shortcut": shortcut, "update.lr_actor": 1e-2,
                                    "update.lr_critic": 1e-2, **sets})
    in_update = on_policy_values(config)
    torch.manual_seed(0)
    stack = PolicyStack(_llama(), config.lora, with_critic=True)
    assert stack.critic_shortcut is shortcut
    with torch.no_grad():  # a critic whose values are not 0 (the value head starts at 0)
        for p in stack.parameters_of("critic"):
            p.add_(0.3 * torch.randn_like(p))
    plan = StepPlan(reference=config.kl.beta > 0, critic=not in_update, greedy=False, critic_in_update=in_update,
                    base_hidden=stack.critic_shortcut)
    r = rollout(stack, TOK, get_task("arithmetic").train[:8], torch.arange(8), cfg=config.rollout, plan=plan,
                reward_fn=digit_share, seed=0, step=0)
    assert (r.forwards.base_hidden is not None) is shortcut
    targets = estimate(resolve_estimator(config), *r, shape_rewards(*r, config.kl.beta, config.kl), config.estimator)
    result = update(stack, make_optimizers(stack, config.update), r.rows, targets,
                    config.update, config.kl, config.kl.beta, config.rollout.temperature,
                    torch.Generator().manual_seed(7), critic_values=r.forwards.value_graph)
    return r.forwards.values, result.stats, trainable_state(stack)


@pytest.mark.parametrize("sets", list(PLANS.values()), ids=list(PLANS))
def test_the_shortcut_changes_no_number_of_a_step(sets: dict) -> None:
    """The same ppo step with the shortcut and with the full forward and backward of the same top-k
    critic (float64): equal values, losses, actor and critic weights."""
    (v1, s1, w1), (v0, s0, w0) = _ppo_step(True, sets), _ppo_step(False, sets)
    assert v0.abs().max() > 1e-3 and s0["value_loss"] > 0
    torch.testing.assert_close(v1, v0, atol=1e-10, rtol=0)
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "approx_kl"):
        assert s1[key] == pytest.approx(s0[key], abs=1e-10), key
    assert w1.keys() == w0.keys()
    for name in w0:
        torch.testing.assert_close(w1[name], w0[name], atol=1e-10, rtol=0, msg=name)


def test_a_run_with_the_shortcut_matches_one_without(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Through the trainer (float32): the same metrics and weights up to float32 rounding (the lower
    layers run on minibatches in one, on the whole batch in the other)."""
    runs = {}
    for shortcut in (True, False):
        runs[shortcut] = tmp_path / str(shortcut)
        train(load_config(overrides=_config(tiny_model_dir, runs[shortcut], **{"lora.critic_layers": 1,
                                                                               "lora.critic_shortcut": shortcut})))
    fast, slow = _rows(runs[True]), _rows(runs[False])
    assert len(fast) == len(slow) == 2 and slow[-1]["value_loss"] > 0
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys() and a["reward_mean"] == b["reward_mean"] and a["tokens"] == b["tokens"]
        for key in ("value_loss", "policy_loss", "critic_grad_norm", "actor_grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    for role in ("actor", "critic"):
        a, b = _weights(runs[True], role), _weights(runs[False], role)
        assert a.keys() == b.keys()
        for n in a:
            torch.testing.assert_close(a[n], b[n], atol=1e-5, rtol=0)
    assert all(".layers.1." in n for n in _weights(runs[True], "critic") if "lora_" in n)


def test_resume_is_bit_identical(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = {"lora.critic_layers": 1}
    train(load_config(overrides=_config(tiny_model_dir, tmp_path / "full", steps=3, **base)))
    train(load_config(overrides=_config(tiny_model_dir, tmp_path / "cut", steps=2, **base)))
    saved = load_config(tmp_path / "cut" / "config.yaml", {"out": str(tmp_path / "cut"), "steps": 3})
    assert saved.lora.critic_layers == 1  # round-trips through config.yaml
    train(saved, resume=True)
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "full") and len(_rows(tmp_path / "full")) == 3
    for role in ("actor", "critic"):
        a, b = _weights(tmp_path / "full", role), _weights(tmp_path / "cut", role)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
