"""LoRA dropout regularises the update only: every other forward of the stack is deterministic.

The stack keeps every module in eval mode; `stack.dropout_active()` turns the LoRA dropout modules to
train mode for the update's gradient forwards (actor and critic passes, the critic forward `forward`
keeps for the update) and back.
With `lora.dropout` = 0.5 and adapters far from zero, a dropout mask changes the outputs a lot, so
each "equal" below would fail if dropout leaked into that forward, and each "differs" shows that
dropout really is active where it should be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from llmrl import load_config, train
from llmrl.step.records import Forwards, Samples, StepPlan, Targets, TrainRows
from llmrl.run.checkpoint import trainable_state
from llmrl.config.schema import KLConfig, LoraConfig, RolloutConfig, UpdateConfig
from llmrl.run.evaluate import evaluate
from llmrl.engines.hf import HFEngine
from llmrl.step.forward import forward, masked_logprobs, masked_values
from llmrl.step.generate import decode
from llmrl.engines.hf import generate, row_uniforms
from llmrl.step.update import _actor_loss, make_optimizers, update
from llmrl.models.prefix import distinct_prompts
from llmrl.models.stack import PolicyStack, layout
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import TASKS, get_task

from tests.conftest import make_tiny_model
from tests.helpers import digit_share, digits_task, is_timing
from tests.steps import rollout

TOK = build_char_tokenizer()
ROWS = get_task("arithmetic").eval[:16]


def _stack(dropout: float = 0.5, dtype: torch.dtype = torch.float64, with_critic: bool = True) -> PolicyStack:
    """A tiny Llama stack whose adapters (and value head) are far from zero."""
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(dtype), LoraConfig(r=4, alpha=8.0, dropout=dropout), with_critic=with_critic)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for role in stack.trainable_roles():
            for p in stack.parameters_of(role):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return stack


def _dropouts(stack: PolicyStack) -> list[nn.Dropout]:
    return [m for n, m in stack.named_modules() if isinstance(m, nn.Dropout) and "lora_dropout" in n]


def _sampled_batch(stack: PolicyStack, logprobs: bool = False) -> tuple[Samples, torch.Tensor | None]:
    """4 prompts × 2 samples, drawn with the per-row uniforms: (samples, decoding log-probs or None)."""
    rows = ROWS[:4]
    ids = TOK([r["prompt"] for r in rows], return_tensors="pt", padding=True)
    ids, mask = ids.input_ids.repeat_interleave(2, 0), ids.attention_mask.bool().repeat_interleave(2, 0)
    u = row_uniforms(0, 1, torch.arange(8) // 2, torch.arange(8) % 2, 6)
    with stack.use("actor"):
        gen = generate(stack, ids, mask, max_new_tokens=6, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id,
                       temperature=1.0, uniforms=u, logprobs=logprobs)
    batch = Samples(tuple(rows), ids, mask, gen.response_ids, gen.response_mask, group_size=2,
                    prompt_index=torch.arange(8) // 2,
                    completions=tuple(decode(TOK, gen.response_ids, gen.response_mask)))
    return batch, gen.logprobs


def test_the_stack_is_in_eval_mode_with_real_dropout_modules() -> None:
    stack = _stack()
    drops = _dropouts(stack)
    assert len(drops) == 2 * 2 * 7  # 2 adapters × 2 layers × 7 linear layers, p = 0.5 each
    assert all(d.p == 0.5 and not d.training for d in drops)
    assert not any(m.training for m in stack.modules())
    with stack.dropout_active():
        assert all(d.training for d in drops)
        assert not stack.training and not stack.lm.training  # only the dropout modules change mode
    assert not any(m.training for m in stack.modules())


def _engine(stack: PolicyStack) -> HFEngine:
    return HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id)


def test_greedy_evaluation_is_deterministic_with_dropout() -> None:
    stack = _stack()
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        runs.append(evaluate(_engine(stack), TOK, ROWS, digit_share, max_new_tokens=6).completions)
    assert runs[0] == runs[1]
    with stack.dropout_active():  # the same evaluation with the masks on is not: dropout is real
        masked = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            masked.append(evaluate(_engine(stack), TOK, ROWS, digit_share, max_new_tokens=6).completions)
    assert masked[0] != masked[1] and masked[0] != runs[0]


def test_no_grad_forwards_equal_those_of_the_same_weights_without_dropout() -> None:
    """Old log-probs, reference log-probs, critic values and sampled tokens with p = 0.5 are exactly
    those of the same weights built with p = 0, whatever the global RNG holds."""
    with_dropout, without = _stack(0.5), _stack(0.0)
    assert _dropouts(without) == []
    results = []
    for stack, seed in ((with_dropout, 1), (with_dropout, 2), (without, 3)):
        torch.manual_seed(seed)
        batch, _ = _sampled_batch(stack)
        with stack.use("actor"):
            old = masked_logprobs(stack, batch, 1.0)
        with stack.use("reference"):
            ref = masked_logprobs(stack, batch, 1.0)
        results.append((batch.response_ids, old, ref, masked_values(stack, batch)))
    assert float(results[0][3].abs().max()) > 0.1 and float((results[0][1] - results[0][2]).abs().max()) > 0.1
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_generation_logprobs_equal_a_no_grad_forward_with_dropout() -> None:
    stack = _stack()
    batch, decoded = _sampled_batch(stack, logprobs=True)
    with stack.use("actor"):
        full = masked_logprobs(stack, batch, 1.0)
    assert decoded is not None and float(full.abs().max()) > 0.5
    torch.testing.assert_close(decoded, full, atol=1e-12, rtol=0)


def _update_inputs(stack: PolicyStack) -> tuple[TrainRows, torch.Tensor, Samples]:
    samples, _ = _sampled_batch(stack)
    with stack.use("actor"):
        old = masked_logprobs(stack, samples, 1.0)
    batch = TrainRows.of(samples, Forwards(old.dtype, old_logprobs=old))
    adv = torch.where(batch.response_mask, torch.linspace(-1, 1, batch.response_ids.numel()).view_as(batch.response_ids)
                      .to(old.dtype), torch.zeros_like(old))
    return batch, adv, samples


def _loss(stack: PolicyStack, batch: TrainRows, adv: torch.Tensor, seed: int) -> float:
    torch.manual_seed(seed)
    totals = {"total_tokens": float(batch.response_mask.sum()), "total_seqs": float(batch.n)}
    with stack.use("actor"):
        loss, _, _ = _actor_loss(stack, batch, adv, UpdateConfig(), KLConfig(beta=0.0), 0.0, 1.0, totals)
    return float(loss.detach())


def test_the_update_forward_uses_dropout_and_the_stack_returns_to_eval() -> None:
    stack = _stack()
    batch, adv, _ = _update_inputs(stack)
    plain = _loss(stack, batch, adv, 1)
    assert plain == _loss(stack, batch, adv, 2)  # outside the context: no mask, whatever the RNG
    with stack.dropout_active():
        masked = [_loss(stack, batch, adv, 1), _loss(stack, batch, adv, 1), _loss(stack, batch, adv, 2)]
    assert masked[0] == masked[1]  # the masks come from the global RNG (checkpointed for resume)
    assert masked[0] != masked[2] and abs(masked[0] - plain) > 1e-3 and abs(masked[2] - plain) > 1e-3

    # a real update: its weights depend on the RNG's masks, and afterwards dropout is off again
    weights = []
    for seed in (5, 5, 6):
        s = _stack()
        b, a, _ = _update_inputs(s)
        torch.manual_seed(seed)
        update(s, make_optimizers(s, UpdateConfig(lr_actor=1e-2, minibatch_size=4)), b, Targets(torch.zeros_like(a), a),
               UpdateConfig(lr_actor=1e-2, minibatch_size=4), KLConfig(beta=0.0), 0.0, 1.0,
               torch.Generator().manual_seed(0))
        assert not any(m.training for m in s.modules())
        weights.append(trainable_state(s))
        after = [_loss(s, b, a, 7), _loss(s, b, a, 8)]
        assert after[0] == after[1]
    name = next(n for n in weights[0] if ".actor." in n and "lora_A" in n)
    assert torch.equal(weights[0][name], weights[1][name])
    assert not torch.equal(weights[0][name], weights[2][name])


def test_without_dropout_the_update_draws_no_random_number() -> None:
    stack = _stack(0.0)
    batch, adv, _ = _update_inputs(stack)
    torch.manual_seed(11)
    update(stack, make_optimizers(stack, UpdateConfig(minibatch_size=4)), batch, Targets(torch.zeros_like(adv), adv),
           UpdateConfig(minibatch_size=4), KLConfig(beta=0.0), 0.0, 1.0, torch.Generator().manual_seed(0))
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3))


def test_on_policy_shortcuts_keep_ratio_one_under_dropout() -> None:
    """`update.on_policy_logprobs`: log π_old is the masked update forward's own, so the ratio is
    exactly 1 (approx KL and clip fraction exactly 0) and differs from the deterministic forward's.
    `update.on_policy_values`: V_old is the masked critic forward's, which the value loss reuses."""
    stack = _stack()
    deterministic_rows, adv, samples = _update_inputs(stack)
    deterministic = deterministic_rows.old_logprobs
    torch.manual_seed(1)
    kept = forward(stack, samples, StepPlan(reference=False, critic=False, greedy=False, old_logprobs=False,
                                            critic_in_update=True), 1.0)
    values = kept.value_graph
    assert not any(m.training for m in stack.modules())
    plain_values = masked_values(stack, samples)
    assert torch.equal(kept.values, torch.where(samples.response_mask, values.detach(), torch.zeros_like(values)))
    assert float((kept.values - plain_values).abs().max()) > 1e-2  # the gradient forward was masked
    batch = TrainRows.of(samples, kept)
    assert batch.old_logprobs is None  # the update's own forward provides them
    returns = kept.values + adv
    cfg = UpdateConfig(minibatch_size=8, lr_actor=1e-2)
    result = update(stack, make_optimizers(stack, cfg), batch, Targets(torch.zeros_like(adv), adv, returns), cfg, KLConfig(beta=0.0),
                    0.0, 1.0, torch.Generator().manual_seed(0), on_policy=True, critic_values=values)
    stats = result.stats
    assert stats["approx_kl"] == 0.0 and stats["clip_frac"] == 0.0
    assert stats["policy_loss"] == pytest.approx(-float(adv.sum() / batch.response_mask.sum()), abs=1e-12)
    masked_old = result.old_logprobs
    assert float((masked_old - deterministic).abs().max()) > 1e-2 and bool((masked_old[batch.response_mask] != 0).all())
    # value loss without clipping effect: V = V_old at the one step, so the loss is ½·mean((V − R)²)
    mask = batch.response_mask
    assert stats["value_loss"] == pytest.approx(float(0.5 * (adv[mask] ** 2).mean()), abs=1e-12)


def test_a_run_with_dropout_resumes_bit_identically(tiny_model_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", digits_task)
    base = {"model.name": str(tiny_model_dir), "task": "digits", "lora.dropout": 0.5, "rollout.prompts_per_step": 8,
            "update.minibatch_size": 4, "eval.size": 8, "eval.every": 0, "checkpoint.every": 2,
            "update.lr_actor": 1e-2, "update.lr_critic": 1e-2}
    train(load_config(overrides={**base, "out": str(tmp_path / "full"), "steps": 4}))
    train(load_config(overrides={**base, "out": str(tmp_path / "cut"), "steps": 2}))
    train(load_config(tmp_path / "cut" / "config.yaml", {"out": str(tmp_path / "cut"), "steps": 4}), resume=True)
    rows = {run: [{k: v for k, v in json.loads(line).items() if not is_timing(k)}
                  for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("full", "cut")}
    assert len(rows["full"]) == 4 and rows["cut"] == rows["full"]
    for role in ("actor", "critic"):
        a = load_file(tmp_path / "full" / "adapters" / role / "adapter_model.safetensors")
        b = load_file(tmp_path / "cut" / "adapters" / role / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role
    # the masks mattered: without dropout the same run ends elsewhere
    train(load_config(overrides={**base, "lora.dropout": 0.0, "out": str(tmp_path / "plain"), "steps": 4}))
    plain = load_file(tmp_path / "plain" / "adapters" / "actor" / "adapter_model.safetensors")
    full = load_file(tmp_path / "full" / "adapters" / "actor" / "adapter_model.safetensors")
    assert any(not torch.equal(plain[k], full[k]) for k in full)


def test_rollout_plan_forwards_are_deterministic_under_dropout() -> None:
    """The whole rollout (sampling, old and reference log-probs, values) with p = 0.5 equals the
    rollout of the same weights built with p = 0."""
    cfg = RolloutConfig(prompts_per_step=4, num_generations=2, max_new_tokens=6)
    plan = StepPlan(reference=True, critic=True, greedy=True, from_generation=False)
    out = []
    for p, seed in ((0.5, 1), (0.0, 2)):
        stack = _stack(p)
        torch.manual_seed(seed)
        r = rollout(stack, TOK, ROWS[:4], torch.arange(4), cfg=cfg, plan=plan, reward_fn=digit_share, seed=0, step=0)
        out.append((r.completions, r.forwards.old_logprobs, r.forwards.ref_logprobs, r.forwards.values,
                    r.scores.baseline))
    assert out[0][0] == out[1][0]
    for a, b in zip(out[0][1:], out[1][1:]):
        assert torch.equal(a, b)


def test_a_gradient_forward_with_dropout_draws_each_rows_own_masks_with_shared_prompts() -> None:
    # issue 59 item 3: with shared prompts a prompt runs once for its G rows (and an opening all prompts
    # share once for every row), so its positions would get one dropout mask for all of them; the update's
    # gradient forwards therefore run every row's prompt itself while dropout draws masks, and give exactly
    # what a stack without prompt sharing gives from the same RNG state (the same calls in the same order)
    stack = _stack()
    batch, _ = _sampled_batch(stack)
    seq = layout(batch.prompt_ids, batch.prompt_mask.long(), batch.response_ids, batch.response_mask.long())
    assert distinct_prompts(seq.ids[:, : seq.prompt_len], seq.attention[:, : seq.prompt_len]) is not None
    out = {}
    for shared in (True, False):
        stack.share_prompts = shared
        with stack.use("actor"), stack.dropout_active():
            torch.manual_seed(11)
            out[shared] = stack.hidden(seq)
    assert torch.equal(out[True], out[False])
    with torch.no_grad(), stack.use("actor"):  # outside the update (dropout off) the prompts are shared again
        stack.share_prompts = True
        calls: list[int] = []
        hook = stack.lm.get_decoder().register_forward_hook(lambda m, a, o: calls.append(1))
        stack.hidden(seq)
        hook.remove()
    assert len(calls) == 2  # the distinct prompts, then every row's response (models/prefix.py)
