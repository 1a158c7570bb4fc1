"""Chunked log-probs (models/logprobs.py): the same log π, entropy and gradients as the whole
(N, T, V) computation, without a (N, T, V) tensor kept for the backward."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.schema import LoraConfig
from llmrl.models.logprobs import chunk_positions
from llmrl.models.stack import PolicyStack, layout, token_logprobs

from tests.qwen2_tiny import VOCAB, make_qwen2


def _stack(dtype: torch.dtype, head_trained: bool = False) -> PolicyStack:
    lora = LoraConfig(r=4, alpha=8.0, modules_to_save=["lm_head"] if head_trained else None)
    stack = PolicyStack(make_qwen2(dtype=dtype), lora, with_critic=False)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at zero: make the actor differ from the base
        for name, p in stack.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    return stack


def _batch():
    """3 rows: left-padded prompts of 3, 2 and 4 tokens, responses of 5, 2 and 0 tokens."""
    prompts = torch.tensor([[0, 7, 8, 17], [0, 0, 5, 6], [9, 10, 11, 12]])
    resp = torch.tensor([[30, 400, 9, 2000, 2], [4095, 2, 0, 0, 0], [0, 0, 0, 0, 0]])
    rmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    return layout(prompts, prompts != 0, resp, rmask), resp, rmask


def _run(stack: PolicyStack, chunk: int, temperature: float = 0.7):
    """(log π, H, gradients) of loss = Σ_masked (a_t log π_t + b_t H_t) with fixed weights a, b."""
    stack.logits_chunk = chunk
    seq, resp, mask = _batch()
    stack.zero_grad(set_to_none=True)
    lp, ent = stack.response_stats(seq, resp, mask, temperature, entropy="trained")
    a = torch.linspace(-1.0, 1.0, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
    b = torch.linspace(0.5, -0.3, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
    (torch.where(mask, a * lp + b * ent, torch.zeros_like(lp))).sum().backward()
    grads = {n: p.grad.clone() for n, p in stack.peft.named_parameters() if p.grad is not None}
    return torch.where(mask, lp, 0).detach(), torch.where(mask, ent, 0).detach(), grads


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("head_trained", [False, True])
def test_chunks_give_the_whole_batch_numbers(dtype: torch.dtype, atol: float, head_trained: bool) -> None:
    # float64: the chunks' sums differ from the whole batch's only in the last bits (1e-10 is ~1e6 ulps
    # of margin); float32: log π of magnitude ~10 carries ~1e-6 of rounding, gradients summed over 7 tokens ~1e-5
    stack = _stack(dtype, head_trained)
    whole = _run(stack, chunk=10**9)
    for chunk in (1, 3, 6):  # 7 masked positions: 7 chunks, 3 (3+3+1), 2 (6+1)
        lp, ent, grads = _run(stack, chunk)
        torch.testing.assert_close(lp, whole[0], atol=atol, rtol=0)
        torch.testing.assert_close(ent, whole[1], atol=atol, rtol=0)
        assert grads.keys() == whole[2].keys() and len(grads) > 0
        if head_trained:
            assert any("lm_head" in n for n in grads)
        for name in grads:
            torch.testing.assert_close(grads[name], whole[2][name], atol=atol, rtol=0, msg=name)
    # and the whole-batch path is the plain (N, T, V) log-softmax, bit for bit
    stack.logits_chunk = 10**9
    seq, resp, mask = _batch()
    with torch.no_grad():
        lp, _ = stack.response_stats(seq, resp, mask, 0.7)
        assert torch.equal(lp, token_logprobs(stack.response_logits(seq, 0.7), resp))


def _largest_saved(stack: PolicyStack, chunk: int) -> int:
    """The most elements of any vocabulary-wide tensor autograd keeps for the backward."""
    stack.logits_chunk = chunk
    seq, resp, mask = _batch()
    sizes = [0]

    def pack(x: torch.Tensor) -> torch.Tensor:
        if x.dim() and x.shape[-1] == VOCAB and x.shape[0] != VOCAB:  # logits-like, not the head's weight
            sizes.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        lp, ent = stack.response_stats(seq, resp, mask, 1.0, entropy="trained")
    (lp.sum() + ent.sum()).backward()
    return max(sizes)


def test_no_vocabulary_wide_tensor_is_kept_for_the_backward() -> None:
    stack = _stack(torch.float32)
    # whole batch: log-softmax of every (row, position), 3 × 5 × V, is kept for the backward
    assert _largest_saved(stack, 10**9) >= 3 * 5 * VOCAB
    # chunked: the checkpointed chunks keep only their inputs; nothing vocabulary-wide outlives a chunk
    assert _largest_saved(stack, 2) == 0


def test_chunk_positions_from_the_budget() -> None:
    # 64 MiB of float32 logits at Qwen2.5's vocabulary: 67,108,864 / (4 · 151,936) = 110.4 → 110 positions
    assert chunk_positions(64, 151_936) == 110
    assert chunk_positions(64, 49_152) == 341  # SmolLM2: 67,108,864 / 196,608 = 341.3
    assert chunk_positions(0.0001, 151_936) == 1  # at least one position
    assert chunk_positions(0, 151_936) >= 2**62  # 0: no limit


def _grads(stack: PolicyStack, dropout: bool) -> tuple[dict[str, torch.Tensor], int]:
    """LoRA gradients of Σ_masked a_t log π_t, and how many tensors autograd kept for the backward."""
    seq, resp, mask = _batch()
    stack.zero_grad(set_to_none=True)
    saved = [0]

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved[0] += 1
        return x

    torch.manual_seed(5)  # the LoRA dropout's masks
    with stack.use("actor"), (stack.dropout_active() if dropout else torch.enable_grad()):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            lp, _ = stack.response_stats(seq, resp, mask, 0.7)
        a = torch.linspace(-1.0, 1.0, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
        torch.where(mask, a * lp, torch.zeros_like(lp)).sum().backward()
    return {n: p.grad.clone() for n, p in stack.peft.named_parameters() if p.grad is not None}, saved[0]


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_activation_checkpointing_gives_the_same_gradients_from_fewer_kept_tensors(dropout: float) -> None:
    # float64: recomputing a layer repeats its arithmetic exactly, so only the prompt sharing the
    # checkpointed forward gives up (another order of the same sums) moves the last bits
    stacks = []
    for on in (False, True):
        stack = PolicyStack(make_qwen2(dtype=torch.float64), LoraConfig(r=4, alpha=8.0, dropout=dropout),
                            with_critic=False, activation_checkpointing=on)
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in stack.peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.2)
        stacks.append(stack)
    (plain, kept_plain), (ckpt, kept_ckpt) = (_grads(s, dropout > 0) for s in stacks)
    assert plain.keys() == ckpt.keys() and len(plain) == 2 * 7 * 2  # A and B of 7 layers × 2 decoder layers
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-10, rtol=0, msg=name)
    assert kept_ckpt < kept_plain / 3, (kept_ckpt, kept_plain)  # each layer keeps its input, not its insides
    with torch.no_grad():  # a no-grad forward shares prompts and runs the layers plainly
        seq, resp, mask = _batch()
        torch.testing.assert_close(stacks[1].response_stats(seq, resp, mask, 0.7)[0],
                                   stacks[0].response_stats(seq, resp, mask, 0.7)[0], atol=1e-10, rtol=0)
