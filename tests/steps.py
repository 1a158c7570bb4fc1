"""The first verbs of a step chained for tests: generate → score → forward, with the `hf` engine."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from torch import Tensor

from llmrl.config.schema import RolloutConfig
from llmrl.engines.hf import HFEngine
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import stop_token_ids
from llmrl.step.forward import forward
from llmrl.step.generate import generate
from llmrl.step.records import Forwards, Samples, Scores, StepPlan, TrainRows, check_shapes
from llmrl.step.score import score


class Rollout(NamedTuple):
    samples: Samples
    scores: Scores
    forwards: Forwards

    @property
    def rows(self) -> TrainRows:
        return TrainRows.of(self.samples, self.forwards)

    @property
    def completions(self) -> list[str]:
        return list(self.samples.completions)


def rollout(stack: PolicyStack, tokenizer: Any, rows: Sequence[dict[str, Any]], prompt_index: Tensor, *,
            cfg: RolloutConfig, plan: StepPlan, reward_fn: Any, seed: int, step: int) -> Rollout:
    """What a training step computes before its advantages, as the loop chains it (run/one_step.py)."""
    engine = HFEngine(stack, stop_token_ids(tokenizer, stack.lm), tokenizer.pad_token_id)
    samples = generate(engine, tokenizer, rows, prompt_index, cfg=cfg, seed=seed, step=step, device=stack.lm.device,
                       logprobs=plan.old_logprobs and plan.from_generation, greedy=plan.greedy)
    scores = score(samples, reward_fn, stack.lm.device)
    forwards = forward(stack, samples, plan, cfg.temperature)
    check_shapes(samples, forwards, scores)
    return Rollout(samples, scores, forwards)
