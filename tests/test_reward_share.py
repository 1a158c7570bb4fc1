"""A reward model's pairs with their shared prefix run once (reward_model/pairs_eval.shared_pairs,
RewardScorer.shared): the same scores and gradients as the plain forward of both whole texts, in fewer
positions. On the random 2-layer Llama of conftest.py with its character tokenizer (one token a character)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl.config.schema import LoraConfig
from llmrl.models.load import load_base
from llmrl.models.scorer import RewardScorer
from llmrl.reward_model.pairs_eval import pair_forward, shared_pairs
from llmrl.tasks.preferences import Pair

from .test_reward_model import reward_config, write_pairs

OPENING = "system: add the numbers. "  # 25 tokens every text starts with


def scorer_of(tiny_model_dir: Path, tmp_path: Path, dropout: float = 0.0) -> tuple[RewardScorer, object]:
    config = reward_config(tiny_model_dir, write_pairs(tmp_path / "p.jsonl", 8), tmp_path / "r")
    base, tokenizer = load_base(config.model, False)
    scorer = RewardScorer(base, LoraConfig(r=4, alpha=8.0, dropout=dropout), 0)
    with torch.no_grad():  # lora_B starts at 0: give the adapter a part in the scores and gradients
        for name, p in scorer.peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    return scorer, tokenizer


def pairs(n: int = 8) -> list[Pair]:
    return [Pair(f"{OPENING}{a}+{a + 3}={2 * a + 3}", f"{OPENING}{a}+{a + 3}={2 * a + 4}1") for a in range(10, 10 + n)]


def scores_and_grads(scorer: RewardScorer, tokenizer: object, batch: list[Pair], share: bool):
    scorer.zero_grad(set_to_none=True)
    w, l = pair_forward(scorer, tokenizer, batch, share)
    torch.nn.functional.logsigmoid(w - l).mean().backward()
    return torch.cat([w, l]).detach(), [p.grad.clone() for p in scorer.parameters_of("reward")]


def test_layout_splits_each_pair_at_its_common_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    _, tok = scorer_of(tiny_model_dir, tmp_path)
    batch = shared_pairs(tok, ["5612", "7899", "5634", "789"], torch.device("cpu"))
    # pair 0: "5612" / "5634" share 2 tokens; pair 1: "7899" / "789" share min(4, 3) − 1 = 2 (each keeps one)
    assert batch.sequences.prompt_len == 2 and batch.ends.tolist() == [1, 1, 1, 0]
    assert batch.groups.first.tolist() == [0, 1] and batch.groups.inverse.tolist() == [0, 1, 0, 1]
    # positions counted from each row's first token (row 3's pad column repeats its last: it is masked)
    assert batch.sequences.positions[:, 2:].tolist() == [[2, 3], [2, 3], [2, 3], [2, 2]]
    assert batch.sequences.attention[:, 2:].tolist() == [[1, 1], [1, 1], [1, 1], [1, 0]]
    assert shared_pairs(tok, ["12", "56", "34", "57"], torch.device("cpu")) is None  # pair 0 shares no token


@pytest.mark.parametrize("n", [2, 8])
def test_shared_scores_and_gradients_equal_the_plain_forward(tiny_model_dir: Path, tmp_path: Path, n: int) -> None:
    scorer, tok = scorer_of(tiny_model_dir, tmp_path)
    # a call of the tiny model costs more positions than the opening saves; at n = 8 count a call as free, so
    # the 25-token opening runs once (25 · 7 > 0), at n = 2 as dear (25 · 1 < 10⁹): no opening
    scorer.call_cost = 0.0 if n == 8 else 1e9
    calls: list[int] = []
    hook = scorer.peft.base_model.model.get_decoder().register_forward_hook(lambda m, a, k: calls.append(1))
    plain_r, plain_g = scores_and_grads(scorer, tok, pairs(n), False)
    plain_calls = len(calls)
    shared_r, shared_g = scores_and_grads(scorer, tok, pairs(n), True)
    hook.remove()
    # 1 call plain; shared: the prompts, then the 2n responses, plus the opening at n = 8
    assert plain_calls == 1 and len(calls) - plain_calls == (3 if n == 8 else 2)
    # float32 sums over different matmul shapes: agreement to ~1e-6 of scores O(1); 1e-5 leaves room
    assert torch.allclose(shared_r, plain_r, atol=1e-5, rtol=0), (shared_r - plain_r).abs().max()
    assert len(set(shared_r.tolist())) > n  # the scores differ from row to row: the comparison has teeth
    for g_plain, g_shared in zip(plain_g, shared_g):
        scale = float(g_plain.abs().max())
        assert scale > 0 and torch.allclose(g_shared, g_plain, atol=1e-5 * max(scale, 1.0), rtol=0)


def test_lora_dropout_keeps_the_plain_forward_in_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With dropout drawing masks in a gradient forward, a prefix run once would give both texts one mask:
    the update's forward stays the plain one (one decoder call), the no-grad evaluation shares."""
    scorer, tok = scorer_of(tiny_model_dir, tmp_path, dropout=0.1)
    calls: list[int] = []
    scorer.peft.base_model.model.get_decoder().register_forward_hook(lambda m, a, k: calls.append(1))
    with scorer.dropout_active():
        pair_forward(scorer, tok, pairs(2), True)
    assert len(calls) == 1
    with torch.no_grad():
        pair_forward(scorer, tok, pairs(2), True)
    assert len(calls) == 3
