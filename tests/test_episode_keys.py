"""The seeds an environment's `reset` gets (issue 45, item 5): a row's G episodes play one game, and
evaluation deals its games from a key space no training step uses."""

from __future__ import annotations

from typing import Any

import torch

from llmrl.config.schema import RolloutConfig
from llmrl.engines.base import row_keys
from llmrl.engines.hf import HFEngine
from llmrl.envs import EnvSpec, EnvStep
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.run.evaluate import evaluate_episodes, evaluate_sampled_episodes
from llmrl.step.episodes import generate_episodes

from tests.test_prefix import _stack

CPU = torch.device("cpu")
ROWS = [{"prompt": "12+3=", "answer": "15"}, {"prompt": "4+56=", "answer": "60"}, {"prompt": "7*8=", "answer": "56"}]


class Dealer:
    """Deals its game from `seed` (here: only records it) and ends after one turn."""

    seen: list[int] = []

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        type(self).seen.append(seed)
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        return EnvStep(done=True)


class OwnDealer(Dealer):
    seen: list[int] = []
    seed_per_episode = True


def _engine() -> tuple[HFEngine, Any]:
    tok = build_char_tokenizer()
    stack = _stack()
    return HFEngine(stack, stop_token_ids(tok, stack.lm), tok.pad_token_id), tok


def _play(env: type[Dealer], g: int = 4, seed: int = 7, step: int = 2) -> list[int]:
    engine, tok = _engine()
    env.seen = []
    cfg = RolloutConfig(max_new_tokens=3, max_turns=2, num_generations=g)
    generate_episodes(engine, tok, EnvSpec("dealer", env), ROWS, torch.tensor([4, 0, 9]), cfg=cfg, seed=seed,
                      step=step, device=CPU, stop_ids=engine.stop_ids)
    return list(env.seen)


def test_a_rows_episodes_play_one_game() -> None:
    """Train rows 4, 0, 9 at seed 7, step 2, G = 4: each row's four resets get the key of its sample 0,
    (7, 2, row, 0); a class with seed_per_episode gets each episode's own sampling key."""
    seeds = _play(Dealer)
    games = row_keys(7, 2, torch.tensor([4, 0, 9]), torch.zeros(3, dtype=torch.long)).tolist()
    assert seeds == [k for k in games for _ in range(4)] and len(set(games)) == 3
    own = _play(OwnDealer)
    keys = row_keys(7, 2, torch.tensor([4, 0, 9]).repeat_interleave(4), torch.arange(4).repeat(3)).tolist()
    assert own == keys and len(set(own)) == 12


def test_evaluation_deals_games_no_training_step_deals() -> None:
    """Held-out row i resets with (0, EVAL_STEP = −1, i, 0): not a key of any train row j < 100, sample < 8 of
    the steps 0 … 49 of a run at seed 0 (before: the key of train row i, sample 0, step 0). The sampled
    evaluation's K episodes of row i play that same game."""
    engine, tok = _engine()
    cfg = RolloutConfig(max_new_tokens=3, max_turns=2)
    Dealer.seen = []
    evaluate_episodes(engine, tok, EnvSpec("dealer", Dealer), ROWS, lambda p, c, **_: [0.0] * len(c), cfg=cfg,
                      stop_ids=engine.stop_ids)
    greedy = list(Dealer.seen)
    assert len(set(greedy)) == 3
    trained = {k for s in range(50) for k in row_keys(0, s, torch.arange(100).repeat_interleave(8),
                                                     torch.arange(8).repeat(100)).tolist()}
    assert not set(greedy) & trained
    Dealer.seen = []
    evaluate_sampled_episodes(engine, tok, EnvSpec("dealer", Dealer), ROWS, lambda p, c, **_: [0.0] * len(c), cfg=cfg,
                              samples=4, seed=0, stop_ids=engine.stop_ids)
    assert Dealer.seen == [k for k in greedy for _ in range(4)]
