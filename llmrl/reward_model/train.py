"""`llmrl reward train`: a LoRA adapter and a score head on the base, trained on preference pairs with the
Bradley–Terry loss (pairs_eval.py has the formulas).

Optimizer step k (0-based) takes pairs [k·B, (k+1)·B) of the concatenated epoch orders, epoch e's order a
permutation drawn from seed·7919 + e: which pairs a step sees is a function of (seed, k) alone, so a run
resumed from its checkpoint (adapter, head, AdamW state, RNG) repeats the uninterrupted run bit for bit.
S = ⌈epochs · |train| / B⌉ steps; the learning rate follows step/schedule.lr_factor over S. A step's B pairs
run in micro-batches of `rm.micro_batch_size`, each loss weighted by its share of B, so the gradient is the
whole batch's mean whatever the micro-batch.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch

from ..config.reward_run import RewardRunConfig
from ..errors import ConfigError, LLMRLError
from ..losses import bradley_terry, pair_stats
from ..memory.allocator import set_allocator
from ..memory.budget import run_budget
from ..models.load import load_base, resolve_device
from ..models.scorer import RewardScorer
from ..models.stack import check_lora_targets
from ..run.checkpoint import (CheckpointDamaged, list_checkpoints, load_checkpoint, restore_rng, rng_state,
                              save_checkpoint)
from ..run.folder import RunFolder, json_lines
from ..run.signals import graceful_stop
from ..run.memory import peak_rss_mib
from ..step.schedule import lr_factor
from ..tasks.preferences import Pair, check_lengths, load_pairs
from .folder import draw_reward_curves, stored_config, write_reward_run, write_summary
from .pairs_eval import margins_of, pair_forward, score_pairs

class RunStopped(LLMRLError):
    """A reward run stopped by a signal at a step boundary, its checkpoint written (exit 130, as Ctrl-C)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=130)


Progress = Callable[[int, int, dict[str, float]], None]  # (step, steps, metrics) after each optimizer step


@dataclass(frozen=True)
class RewardRunResult:
    """What `train_reward` did: the folder, the steps, held-out metrics before and after, seconds."""

    path: Path
    steps: int
    before: dict[str, float]
    after: dict[str, float]
    seconds: float
    peak_rss_mib: float


def default_out(config: RewardRunConfig) -> Path:
    stem = Path(config.pairs.dataset or "pairs").stem.replace("/", "-")
    return Path("runs") / f"reward-{stem}-{datetime.now():%Y%m%d-%H%M%S}"


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """Epoch `epoch`'s order of the n training pairs: a permutation drawn from seed·7919 + epoch."""
    return tuple(torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist())


def step_pairs(train: list[Pair], seed: int, step: int, batch: int) -> list[Pair]:
    """The pairs of optimizer step `step` (module docstring): positions [step·B, (step+1)·B) of the epoch orders."""
    n = len(train)
    return [train[epoch_order(n, seed, pos // n)[pos % n]] for pos in range(step * batch, (step + 1) * batch)]


def total_steps(config: RewardRunConfig, n_train: int) -> int:
    return max(1, math.ceil(config.rm.epochs * n_train / config.rm.batch_size))


def held_out(scorer: RewardScorer, tokenizer: Any, pairs: list[Pair], config: RewardRunConfig) -> dict[str, float]:
    """eval_loss, eval_accuracy, eval_margin, eval_chosen_score, eval_rejected_score over the held-out pairs."""
    if not pairs:
        return {}
    s = score_pairs(scorer, tokenizer, pairs, config.rm.eval_batch_size, config.rm.share_prompt)
    return s.metrics("eval_", margins_of(pairs), config.rm.center_coefficient)


def update(scorer: RewardScorer, tokenizer: Any, batch: list[Pair], opt: torch.optim.Optimizer,
           config: RewardRunConfig) -> dict[str, float]:
    """One optimizer step over `batch`: Σ_micro (|micro|/B)·loss_micro backpropagated, the norm clipped."""
    opt.zero_grad(set_to_none=True)
    size = config.rm.micro_batch_size or len(batch)
    chosen, rejected, total = [], [], 0.0
    with scorer.dropout_active():
        for start in range(0, len(batch), size):
            micro = batch[start:start + size]
            r_w, r_l = pair_forward(scorer, tokenizer, micro, config.rm.share_prompt)
            loss = bradley_terry(r_w, r_l, margins_of(micro), config.rm.center_coefficient) * (len(micro) / len(batch))
            loss.backward()
            total += float(loss.detach())
            chosen.append(r_w.detach())
            rejected.append(r_l.detach())
    params = scorer.parameters_of("reward")
    norm = torch.nn.utils.clip_grad_norm_(params, config.rm.max_grad_norm if config.rm.max_grad_norm > 0 else math.inf)
    opt.step()
    stats = pair_stats(torch.cat(chosen), torch.cat(rejected))
    return {"loss": total, "accuracy": float(stats["accuracy"]), "margin": float(stats["margin"]),
            "grad_norm": float(norm)}


def train_reward(config: RewardRunConfig, *, overwrite: bool = False, resume: Path | None = None,
                 progress: Progress | None = None, show_progress: bool = True) -> RewardRunResult:
    """Train (or resume) a reward run; returns what it measured. See the module docstring."""
    if resume is not None:
        config = replace(stored_config(resume), out=str(resume))
    if not config.pairs.dataset:
        raise ConfigError("A reward run needs preference pairs: pass --data FILE (or set pairs.dataset).")
    if config.threads:
        torch.set_num_threads(config.threads)
    set_allocator(config.memory.allocator, tight=False)  # 'on' only: no plan says memory is tight (memory/allocator.py)
    base, tokenizer = load_base(config.model, show_progress, run_budget(config, resolve_device(config.model.device)))
    check_lora_targets(base, config.lora)
    train, held = load_pairs(config.pairs, tokenizer)
    limit = config.pairs.max_length or getattr(base.config.get_text_config(), "max_position_embeddings", None)
    for split, pairs in (("train", train), ("held-out", held)):
        if limit:
            check_lengths(pairs, tokenizer, limit, split)
    if config.rm.batch_size > len(train):  # a step would read a pair twice (and a huge one never ends)
        raise ConfigError(f"'rm.batch_size' ({config.rm.batch_size}) exceeds the {len(train)} training pairs of "
                          f"'{config.pairs.dataset}', so a step would read a pair twice; set it to at most {len(train)}.")
    path = Path(config.out) if config.out else default_out(config)
    folder = RunFolder.open(path) if resume is not None else RunFolder.create(path, overwrite)
    torch.manual_seed(config.seed)
    scorer = RewardScorer(base, config.lora, config.seed)
    opt = torch.optim.AdamW(scorer.parameters_of("reward"), lr=config.rm.lr, weight_decay=config.rm.weight_decay)
    steps, first = total_steps(config, len(train)), 0
    if resume is not None and (checkpoints := list_checkpoints(path)):
        first = _restore(path, checkpoints, scorer, opt)
        folder.truncate_metrics(first)
    elif resume is not None:  # stopped before its first checkpoint: from the start
        folder.truncate_metrics(-1)
    else:
        config = replace(config, out=str(path))
        folder.write_config(config)
    started = time.perf_counter()
    before = held_out(scorer, tokenizer, held, config) if first == 0 else _first_eval(folder)
    if first == 0 and before:
        folder.log_metrics({"step": 0, **before})
    warmup = int(config.rm.warmup_ratio * steps)
    with graceful_stop() as stop:
        _loop(scorer, tokenizer, train, held, opt, folder, config, first, steps, warmup, stop, progress)
    after = held_out(scorer, tokenizer, held, config)
    if after:
        folder.log_metrics({"step": steps, **after})
    save_checkpoint(path, steps, scorer, _state(steps, opt), config.checkpoint.keep)
    write_reward_run(folder, scorer, tokenizer, config, None)
    seconds, peak = time.perf_counter() - started, peak_rss_mib()
    write_summary(folder, summarize(config, steps, len(train), len(held), before, after, seconds, peak))
    draw_reward_curves(path)
    return RewardRunResult(path, steps, before, after, seconds, peak)


def _restore(path: Path, checkpoints: list[Path], scorer: RewardScorer, opt: torch.optim.Optimizer) -> int:
    """The newest readable checkpoint loaded into `scorer`, `opt` and the RNG → its step; a damaged one (cut
    short, altered) is skipped with a warning for the one before it, as an RL run's resume does (run/state.py)."""
    damaged: list[CheckpointDamaged] = []
    for checkpoint in reversed(checkpoints):
        try:
            state = load_checkpoint(checkpoint, scorer)
            try:
                opt.load_state_dict(state["optimizers"]["reward"])
                restore_rng(state["rng"])
                step = int(state["step"])
            except Exception as exc:  # KeyError, ValueError, TypeError, RuntimeError of a state whose bytes changed
                raise CheckpointDamaged(f"The checkpoint file {checkpoint / 'state.pt'} holds a state that cannot be "
                                        f"restored ({type(exc).__name__}: {str(exc).strip()[:120]}).") from None
        except CheckpointDamaged as exc:
            damaged.append(exc)
            continue
        if damaged:
            which = "the checkpoint before it" if len(damaged) == 1 else "the newest one that can be read"
            print(f"warning: {damaged[0]} Resuming from {which}, {checkpoint.name}.", file=sys.stderr)
        return step
    raise LLMRLError(f"No checkpoint of '{path}' can be read: {damaged[0]} Start the reward run again with "
                     "--overwrite.")


def _loop(scorer: RewardScorer, tokenizer: Any, train: list[Pair], held: list[Pair], opt: torch.optim.Optimizer,
          folder: RunFolder, config: RewardRunConfig, first: int, steps: int, warmup: int, stop: Any,
          progress: Progress | None) -> None:
    """Optimizer steps first … steps−1 (the module docstring); a first Ctrl-C, SIGTERM or SIGHUP ends the
    step under way, writes a checkpoint there and stops the run (RunStopped): `--resume` goes on from it."""
    path = folder.path
    for step in range(first, steps):
        for group in opt.param_groups:
            group["lr"] = config.rm.lr * lr_factor(step, steps, config.rm.lr_schedule, warmup)
        t0 = time.perf_counter()
        row = update(scorer, tokenizer, step_pairs(train, config.seed, step, config.rm.batch_size), opt, config)
        row = {"step": step + 1, **row, "lr": opt.param_groups[0]["lr"], "step_time_s": time.perf_counter() - t0}
        every = config.rm.eval_every
        if every and (step + 1) % every == 0 and step + 1 < steps:
            row.update(held_out(scorer, tokenizer, held, config))
        folder.log_metrics(row)
        if config.checkpoint.every and (step + 1) % config.checkpoint.every == 0 and step + 1 < steps:
            save_checkpoint(path, step + 1, scorer, _state(step + 1, opt), config.checkpoint.keep)
        if progress is not None:
            progress(step + 1, steps, row)
        if stop.requested and step + 1 < steps:
            save_checkpoint(path, step + 1, scorer, _state(step + 1, opt), config.checkpoint.keep)
            raise RunStopped(f"Stopped after step {step + 1} of {steps}; the checkpoint is saved: continue with "
                             f"`llmrl reward train --resume {path}`.")


def _state(step: int, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """A checkpoint's state.pt: the step, the AdamW state (under run/checkpoint.py's 'optimizers') and the RNG."""
    return {"step": step, "optimizers": {"reward": opt.state_dict()}, "rng": rng_state()}


def _first_eval(folder: RunFolder) -> dict[str, float]:
    """The held-out metrics the run logged at step 0 (a resumed run reports its own 'before')."""
    rows = [r for r in json_lines(folder.path / "metrics.jsonl") if r.get("step") == 0 and "eval_accuracy" in r]
    return {k: v for k, v in rows[0].items() if k != "step"} if rows else {}


def summarize(config: RewardRunConfig, steps: int, n_train: int, n_held: int, before: dict[str, float],
              after: dict[str, float], seconds: float, peak: float) -> dict[str, Any]:
    """RUN/summary.json: the base, the pairs, the steps, held-out accuracy and margin before → after."""
    out: dict[str, Any] = {"kind": "reward-model", "model": config.model.name, "quantize": config.model.quantize,
                           "train_pairs": n_train, "held_out_pairs": n_held, "steps": steps,
                           "seconds": round(seconds, 2), "peak_rss_mib": round(peak, 1)}
    for key in ("accuracy", "margin", "loss"):
        out[f"eval_{key}_before"] = before.get(f"eval_{key}")
        out[f"eval_{key}_after"] = after.get(f"eval_{key}")
    return out
