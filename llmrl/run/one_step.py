"""One training step: the chain of verbs, each timed, and the metrics row made from their records.

    samples   = generate(engine, prompts)              # G responses each (+ greedy ones for ReMax)
    scores    = score(samples, reward)                 # the task's reward, checked
                                                       # (draws.py: in rounds, all-equal groups dropped,
                                                       #  with rollout.filter_groups)
    forwards  = forward(stack, samples, plan)          # old / ref log-probs, values, kept hidden state
    targets   = estimate(estimator, shape_rewards(…))  # advantages, returns (registry, by name)
    lr        = set_learning_rates(opts, step)         # update.lr_schedule: a pure function of the step
    result    = update(stack, rows, targets)           # PPO epochs × minibatches, actor and critic passes
    engine.sync(stack)                                 # the actor's weights changed
    β         = kl_controller.update(KL)

Every collective of a data-parallel run is a call on `s.dist` inside a verb or a `parallel.stats`
function; with one process each is the identity, so this reads as the single-process step.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Iterator

import torch

from ..models.tokenizer import stop_token_ids
from ..corrections import get_correction
from ..parallel.stats import batch_means, sampler_mismatch, sequence_kl
from ..step.episodes import episode_view
from ..step.estimate import estimate, shape_rewards, token_kl
from ..step.forward import forward
from ..step.records import TrainRows
from ..step.overlong import apply_overlong, eos_rate
from ..step.schedule import set_learning_rates
from ..step.update import no_update, update
from .completions import due, sample_rows
from .data import stream_digest
from .draws import draw
from .memory import PhasePeaks
from .session import Session

PHASES = ("generate", "score", "forward", "estimate", "update", "sync")
"""The timed phases of a step; each is logged as `time_<phase>_s` in every metrics row."""

PLAN_PHASES = {"generate": "generate", "score": "score", "forward": "forwards", "estimate": "forwards",
               "update": "update", "sync": "update"}
"""The memory plan's phase (llmrl/memory/plan.py) each timed phase's peak memory is logged under
(`peak_rss_<phase>_mib`): the advantages work on the forwards' tensors, the engine's sync follows the
update."""


class PhaseClock:
    """Wall seconds of each named phase (the GPU synchronised around each on CUDA, so a phase's
    queued kernels are counted in it) and, given `peaks`, its peak memory under its plan phase's name
    (measured outside the timed span)."""

    def __init__(self, device: torch.device, peaks: PhasePeaks | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._cuda = device.type == "cuda"
        self._peaks = peaks

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        with self._peaks(PLAN_PHASES[phase]) if self._peaks is not None else nullcontext():
            if self._cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            yield
            if self._cuda:
                torch.cuda.synchronize()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start  # rounds add up

    def row(self) -> dict[str, float]:
        return {f"time_{p}_s": self.seconds.get(p, 0.0) for p in PHASES}


@dataclass(frozen=True)
class StepReport:
    """What a step leaves behind: its metrics row and the sampled rows due for completions.jsonl."""

    row: dict[str, Any]
    logged: list[dict[str, Any]]


def run_step(s: Session, step: int, peaks: PhasePeaks | None = None) -> StepReport:
    """One generate → score → forward → estimate → update step (0-based `step`); with `peaks`, each
    phase's peak memory is measured into it (its row is the caller's to add: `peaks.step`)."""
    started = time.perf_counter()
    cfg, plan, device = s.config, s.plan, s.stack.lm.device
    clock = PhaseClock(device, peaks)
    index = s.sampler.indices(step)
    mine = index[s.dist.shard(len(index))]  # this rank's prompts (all of them in a single process)
    rows = [s.task.train[i] for i in mine.tolist()]
    drawn = draw(s, step, rows, mine, clock)  # generate → score (in rounds with rollout.filter_groups)
    samples, scores = drawn.samples, drawn.scores
    with clock("forward"):
        forwards = forward(s.stack, samples, plan, cfg.rollout.temperature)
    beta = s.kl.beta
    with clock("estimate"):
        rewards, trained, overlong = apply_overlong(samples, shape_rewards(samples, scores, forwards, beta, cfg.kl),
                                                    cfg, stop_token_ids(s.tokenizer, s.stack.lm), s.dist)
        targets = estimate(s.spec, samples, scores, forwards, rewards, cfg.estimator, s.dist)
    rows_trained = TrainRows.of(samples, forwards)
    if trained is not None:  # update.mask_truncated: the truncated rows weigh nothing in the losses
        rows_trained = replace(rows_trained, response_mask=trained)
    rates = set_learning_rates(s.opts, cfg.update, step, cfg.steps)
    if drawn.stats.get("groups_kept") == 0:  # dynamic sampling kept no group: nothing to learn from
        result = no_update()  # logged as groups_kept 0
    else:
        with clock("update"):
            result = update(s.stack, s.opts, rows_trained, targets, cfg.update, cfg.kl, beta,
                            cfg.rollout.temperature, s.generator, s.dist, on_policy=not plan.old_logprobs,
                            critic_values=forwards.value_graph,
                            actor_scale=drawn.stats["kept_share"] if cfg.rollout.filter_scale else 1.0)
        with clock("sync"):
            s.engine.sync(s.stack)
    old = forwards.old_logprobs if forwards.old_logprobs is not None else result.old_logprobs
    mask = samples.response_mask
    kl = sequence_kl(s.dist, token_kl(old, forwards.ref_logprobs, mask, "k1"), mask)
    if kl is not None:
        s.kl.update(kl, samples.n * s.dist.world_size)
    mismatch = ({} if rows_trained.behaviour_logprobs is None or old is None
                else _sampler_mismatch(s, rows_trained, old))
    row = {
        "step": step + 1,
        "kl": kl,
        "beta": beta,
        **result.stats,
        **rates,
        **mismatch,
        **overlong,
        **s.engine.stats(),
        **batch_means(s.dist, drawn.stream_scores.scores, drawn.stream_scores.parts, mask, targets.advantages,
                      targets.stats),
        **drawn.stats,
        "eos_rate": eos_rate(samples, stop_token_ids(s.tokenizer, s.stack.lm), s.dist),
        "prompts_seen": (step + 1) * cfg.rollout.prompts_per_step,
        "prompt_digest": f"{stream_digest(step * cfg.rollout.prompts_per_step, index):016x}",
        "step_time_s": time.perf_counter() - started,
        **clock.row(),
    }
    # the batch's first rows are rank 0's first rows: rank 0 logs the same samples as one process
    logged = (sample_rows(step + 1, list(samples.rows), samples.completions, scores.scores, samples.group_size,
                          cfg.log.completions_rows, scores.parts or None)
              if s.dist.is_main and due(step + 1, cfg.log.completions_every) else [])
    if logged and samples.episodes is not None:  # an episode's row also shows its turns (step/episodes.py)
        logged = [{**r, **episode_view(s.tokenizer, samples, i)} for i, r in enumerate(logged)]
    return StepReport(row, logged)


def _sampler_mismatch(s: Session, rows: TrainRows, old: torch.Tensor) -> dict[str, float]:
    """The is_* diagnostics and sampler_kl of a step whose sampler μ is not π_old, with the weights
    of `update.is_correction` the update used (over the trained tokens)."""
    u = s.config.update
    assert rows.behaviour_logprobs is not None
    c = get_correction(u.is_correction)(old, rows.behaviour_logprobs, rows.response_mask, u.is_clip, tuple(u.is_band))
    return sampler_mismatch(s.dist, old, rows.behaviour_logprobs, rows.response_mask, c.weights, c.truncated)


def train_step(s: Session, step: int) -> dict[str, Any]:
    """`run_step`'s metrics row."""
    return run_step(s, step).row
