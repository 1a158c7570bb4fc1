"""train: the one loop every algorithm shares.

    for step in range(steps):
        batch   = rollout(prompts)                 # generate; old/ref log-probs, values as needed
        rewards = shape_rewards(batch, β)          # score on the last token, −β·KL_t if in reward
        targets = estimate(estimator, rewards)     # advantages, returns (registry, by name)
        stats   = update(batch, targets)           # PPO epochs × minibatches, actor and critic passes
        β       = kl_controller.update(KL)

The loop never names an algorithm: `setup` reads the estimator's `needs` into a `RolloutPlan`.

Under torchrun with W > 1 processes (../distributed.py) every rank runs this loop on its B/W
prompts of each step; the hooks are `s.dist` calls, all identities in a single-process run.
"""

from __future__ import annotations

import random
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import torch
import yaml
from transformers import PreTrainedTokenizerBase

from ..config import Config
from ..config.load import on_policy_update, on_policy_values
from ..distributed import SINGLE, DistContext, distributed
from ..checkpoint import list_checkpoints, load_checkpoint, restore_rng, rng_state, save_checkpoint
from ..errors import ConfigError, LLMRLError, RunFailed
from ..estimators import EstimatorSpec, get_estimator, import_user_module
from ..kl_control import KLController
from ..memory import peak_device_mib, peak_rss_mib, role_costs
from ..models.load import load_base
from ..models.prompts import apply_chat_setting, tokenize_prompts
from ..models.stack import PolicyStack
from ..run_folder import ReaderFolder, RunFolder, read_run, Run
from ..tasks import Task, task_from_config
from .advantages import estimate, sequence_kl, shape_rewards
from .completions import due, sample_rows
from .data import PromptSampler, stream_digest
from .dist_stats import global_kl, global_row
from .evaluate import EvalResult, evaluate
from .reporting import NullReporter, Reporter
from .rollout import RolloutPlan, generation_logprobs, rollout
from .signals import graceful_stop
from .trackers import Trackers, check_available, open_trackers
from .update import Targets, critic_forward, make_optimizers, update


@dataclass
class Session:
    """Everything a run sets up once."""

    config: Config
    task: Task
    tokenizer: PreTrainedTokenizerBase
    stack: PolicyStack
    spec: EstimatorSpec
    plan: RolloutPlan
    opts: dict[str, torch.optim.Optimizer]
    kl: KLController
    sampler: PromptSampler
    folder: RunFolder
    generator: torch.Generator
    dist: DistContext = SINGLE  # this process's place in a data-parallel run
    samples: list[dict[str, Any]] = field(default_factory=list)  # completions sampled by the last step


def default_out(config: Config) -> Path:
    task = Path(config.data.dataset).stem if config.data.dataset else config.task
    return Path("runs") / f"{config.algo}-{task}-{datetime.now():%Y%m%d-%H%M%S}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def resolve_estimator(config: Config) -> EstimatorSpec:
    if config.estimator.module:
        import_user_module(config.estimator.module)
    spec = get_estimator(config.estimator.name or config.algo)
    if spec.needs.groups and config.rollout.num_generations < 2:
        raise ConfigError(f"Estimator '{spec.name}' compares samples of a prompt; set rollout.num_generations ≥ 2.")
    return spec


def setup(config: Config, reporter: Reporter, overwrite: bool = False, resume: bool = False,
          dist: DistContext = SINGLE) -> Session:
    """Load the task and model, build the stack and optimizers, create (or reopen) the run folder."""
    spec = resolve_estimator(config)
    if config.rollout.prompts_per_step % dist.world_size:
        raise ConfigError(f"'rollout.prompts_per_step' ({config.rollout.prompts_per_step}) must be divisible by "
                          f"the number of processes ({dist.world_size}).")
    task = dist.main_first(lambda: task_from_config(config), local=True)  # a dataset or reward model fills caches once
    path = dist.broadcast_object(Path(config.out) if config.out else default_out(config))
    folder = dist.main_only(lambda: RunFolder.open(path) if resume else RunFolder.create(path, overwrite))
    folder = folder if folder is not None else ReaderFolder(path)
    if config.threads:
        torch.set_num_threads(config.threads)
    base, tokenizer = dist.main_first(lambda: load_base(config.model, show_progress=reporter.interactive), local=True)
    apply_chat_setting(tokenizer, config.data.chat_template, config.model.name)
    seed_everything(config.seed)
    stack = PolicyStack(base, config.lora, with_critic=spec.needs.critic, share_prompts=config.model.share_prompts)
    dist.broadcast_parameters([p for role in stack.trainable_roles() for p in stack.parameters_of(role)])
    if config.dist.shard_base:
        from ..fsdp import shard_base  # late: only runs that ask for it

        dist = shard_base(stack, dist)
    check_context(task, tokenizer, base.config, config.rollout.max_new_tokens)
    critic_in_update = spec.needs.critic and on_policy_values(config)
    plan = RolloutPlan(reference=config.kl.beta > 0, critic=spec.needs.critic and not critic_in_update,
                       greedy=spec.needs.greedy, critic_in_update=critic_in_update, base_hidden=stack.critic_shortcut,
                       old_logprobs=not on_policy_update(config),
                       from_generation=generation_logprobs(config.rollout, base.dtype))
    if not resume:
        folder.write_config(config)
    else:  # a run extended with --steps records its new length: config.yaml stays the recipe of the run
        dist.main_only(lambda: _record_steps(folder, config))
    return Session(
        config, task, tokenizer, stack, spec, plan, make_optimizers(stack, config.update),
        KLController(config.kl.beta, config.kl.adaptive, config.kl.target, config.kl.horizon),
        PromptSampler(len(task.train), config.rollout.prompts_per_step, config.seed), folder,
        torch.Generator().manual_seed(config.seed + 1), dist,
    )


def _record_steps(folder: RunFolder, config: Config) -> None:
    """Rewrite RUN/config.yaml when the resumed run's `steps` differ from the stored ones."""
    stored = yaml.safe_load((folder.path / "config.yaml").read_text()) or {}
    if stored.get("steps") != config.steps:
        folder.write_config(config)


def check_context(task: Task, tokenizer: PreTrainedTokenizerBase, model_config: Any, max_new_tokens: int) -> None:
    """Refuse prompts that cannot fit, with the response, in the model's context window."""
    limit = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    if not limit:
        return
    for split, rows in (("train", task.train), ("eval", task.eval)):
        lengths = [len(ids) for ids in tokenize_prompts(tokenizer, [r["prompt"] for r in rows]).input_ids]
        for i, n in enumerate(lengths):
            if n + max_new_tokens > limit:
                raise ConfigError(
                    f"Prompt {i} of the {split} split has {n} tokens; with rollout.max_new_tokens={max_new_tokens} "
                    f"it exceeds the model's context of {limit} tokens."
                )


def run_eval(s: Session) -> EvalResult | None:
    rows = s.task.eval[: s.config.eval.size]
    if not rows:
        return None
    if s.dist.active and not s.dist.lockstep:  # with a sharded base every rank evaluates every row
        return run_eval_sharded(s, rows)
    return evaluate(s.stack, s.tokenizer, rows, s.task.reward, max_new_tokens=s.config.rollout.max_new_tokens,
                    success=s.task.success, batch_size=s.config.eval.batch_size)


def run_eval_sharded(s: Session, rows: list[dict[str, Any]]) -> EvalResult:
    """Each rank evaluates rows[r::W]; accuracy and mean reward are summed over ranks, the
    completions gathered back into the rows' order."""
    w, r = s.dist.world_size, s.dist.rank
    mine = rows[r::w]
    res = s.dist.agree(lambda: evaluate(s.stack, s.tokenizer, mine, s.task.reward,
                                        max_new_tokens=s.config.rollout.max_new_tokens,
                                        success=s.task.success, batch_size=s.config.eval.batch_size))
    correct, total = s.dist.sum_floats([round(res.accuracy * len(mine)), res.reward_mean * len(mine)])
    parts = s.dist.gather_objects(res.completions)
    completions = [parts[i % w][i // w] for i in range(len(rows))]
    return EvalResult(correct / len(rows), total / len(rows), completions)


def train_step(s: Session, step: int) -> dict[str, Any]:
    """One rollout → reward → advantage → update step; returns its metrics row."""
    started = time.perf_counter()
    cfg = s.config
    index = s.sampler.indices(step)
    mine = index[s.dist.shard(len(index))]  # this rank's prompts (all of them in a single process)
    rows = [s.task.train[i] for i in mine.tolist()]
    batch, completions = s.dist.agree(lambda: rollout(s.stack, s.tokenizer, rows, mine, cfg=cfg.rollout, plan=s.plan,
                                                      reward_fn=s.task.reward, seed=cfg.seed, step=step))
    # the batch's first rows are rank 0's first rows: rank 0 logs the same samples as one process
    s.samples = (sample_rows(step + 1, rows, completions, batch.scores, batch.group_size, cfg.log.completions_rows,
                             batch.reward_parts) if s.dist.is_main and due(step + 1, cfg.log.completions_every) else [])
    beta = s.kl.beta
    values = critic_forward(s.stack, batch) if s.plan.critic_in_update else None  # sets batch.values
    out = estimate(s.spec, batch, shape_rewards(batch, beta, cfg.kl), cfg.estimator, s.dist)
    stats = update(s.stack, s.opts, batch, Targets(out.advantages, out.returns), cfg.update, cfg.kl,
                   beta, cfg.rollout.temperature, s.generator, s.dist, on_policy=not s.plan.old_logprobs,
                   critic_values=values)
    kl = global_kl(s.dist, batch) if s.dist.active else sequence_kl(batch)
    if kl is not None:
        s.kl.update(kl, batch.rows * s.dist.world_size)
    assert batch.scores is not None
    n_tokens = int(batch.response_mask.sum())
    adv = out.advantages[batch.response_mask]
    row = {
        "step": step + 1,
        "reward_mean": batch.scores.mean().item(),
        **{f"reward/{k}": v.mean().item() for k, v in (batch.reward_parts or {}).items()},
        "kl": kl,
        "beta": beta,
        **stats,
        **out.stats,
        "zero_advantage": bool(adv.numel() == 0 or adv.abs().max() == 0),
        "adv_mean": adv.mean().item() if adv.numel() else 0.0,
        "adv_std": adv.std().item() if adv.numel() > 1 else 0.0,
        "response_len": n_tokens / batch.rows,
        "tokens": n_tokens,
        "prompts_seen": (step + 1) * cfg.rollout.prompts_per_step,
        "prompt_digest": f"{stream_digest(step * cfg.rollout.prompts_per_step, index):016x}",
        "step_time_s": time.perf_counter() - started,
    }
    if s.dist.active:
        row.update(global_row(s.dist, batch, out))
    return row


def _state(s: Session, step: int, before: EvalResult | None, elapsed: float) -> dict[str, Any]:
    """Everything besides the weights that an exact resume needs."""
    return {
        "step": step,
        "optimizers": {role: opt.state_dict() for role, opt in s.opts.items()},
        "kl": s.kl.state_dict(),
        "generator": s.generator.get_state(),
        "rng": rng_state(),
        **({"rng_by_rank": s.dist.gather_objects(rng_state())} if s.dist.active else {}),
        "eval_before": None if before is None else {"accuracy": before.accuracy, "reward_mean": before.reward_mean},
        "elapsed_s": elapsed,
    }


def _restore(s: Session) -> tuple[int, EvalResult | None, float]:
    """Load the newest checkpoint into the session: (completed steps, eval-before, elapsed seconds)."""
    found = s.dist.broadcast_object(list_checkpoints(s.folder.path))
    if not found:
        raise LLMRLError(f"'{s.folder.path}' has no checkpoint to resume from; start it again with --overwrite.")
    state = load_checkpoint(found[-1], s.stack)
    for role, opt in s.opts.items():
        opt.load_state_dict(state["optimizers"][role])
    s.kl.load_state_dict(state["kl"])
    s.generator.set_state(state["generator"])
    by_rank = state.get("rng_by_rank")  # a data-parallel run's per-process RNGs, when the world size matches
    restore_rng(by_rank[s.dist.rank] if by_rank and len(by_rank) == s.dist.world_size else state["rng"])
    s.folder.truncate_metrics(state["step"])
    before = state["eval_before"]
    result = None if before is None else EvalResult(before["accuracy"], before["reward_mean"], [])
    return state["step"], result, float(state["elapsed_s"])


def train(config: Config, reporter: Reporter | None = None, overwrite: bool = False, resume: bool = False) -> Run:
    """Run `config` to the end and return the finished run read back from its folder.

    With `resume`, `config.out` must hold a run with a checkpoint: it continues from the newest one
    and, on CPU with the same settings, produces the same metrics as an uninterrupted run.

    Launched by torchrun with W > 1 processes, every process calls this; rank 0 alone reports and
    writes the run folder (the others return the run with empty metrics).
    """
    with distributed(config.model.device, config.dist.timeout_s) as dist:
        return _train(config, (reporter or NullReporter()) if dist.is_main else NullReporter(), overwrite, resume, dist)


def _checkpoint(s: Session, step: int, before: EvalResult | None, elapsed: float) -> None:
    """Checkpoint after `step` (rank 0 writes; every rank takes part, a write error stops every rank)."""
    state = _state(s, step, before, elapsed)
    s.dist.main_only(lambda: save_checkpoint(s.folder.path, step, s.stack, state, s.config.checkpoint.keep))


@dataclass
class _Progress:
    """The loop's running state: newest checkpointed step, non-finite steps in a row."""

    saved: int
    bad: int = 0


def _train(config: Config, reporter: Reporter, overwrite: bool, resume: bool, dist: DistContext) -> Run:
    t0 = time.perf_counter()
    check_available(config.log.report_to)
    s = setup(config, reporter, overwrite, resume, dist)
    start, elapsed = 0, 0.0
    reporter.start(config, role_costs(s.stack), s.folder.path)
    if resume:
        start, before, elapsed = _restore(s)
        reporter.resumed(start)
    else:
        before = run_eval(s)
    reporter.evaluated(0, before)
    trackers = open_trackers(config, s.folder.path, start) if s.dist.is_main else Trackers([])
    if before is not None and not resume:
        trackers.log(_eval_scalars(before), step=0)
    wall = lambda: elapsed + time.perf_counter() - t0  # noqa: E731
    progress = _Progress(saved=start)
    with graceful_stop() as stop, _close_on_error(trackers):
        try:
            for step in range(start, config.steps):
                _one_step(s, step, reporter, trackers, stop, progress, before, wall)
        except RunFailed as exc:
            reporter.stopped()
            _fail(s, exc, progress, before, wall)
        except KeyboardInterrupt:
            reporter.stopped()
            raise LLMRLError(
                f"Interrupted; the newest checkpoint is after step {progress.saved}. "
                f"Continue with: llmrl train --resume {s.folder.path}", exit_code=130
            ) from None
    return _finish(s, reporter, trackers, progress, before, wall)


def _one_step(s: Session, step: int, reporter: Reporter, trackers: Trackers, stop: Any, progress: _Progress,
              before: EvalResult | None, wall: Callable[[], float]) -> None:
    """Train step `step`, evaluate when due, log, checkpoint when due; raise RunFailed after
    `update.max_bad_steps` non-finite steps in a row, KeyboardInterrupt when a stop was requested."""
    config = s.config
    row = train_step(s, step)
    if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.steps:
        result = run_eval(s)
        row["eval_accuracy"] = result.accuracy if result else None
        reporter.evaluated(step + 1, result)
    s.folder.log_metrics(row)
    trackers.log(row)
    _log_samples(s, reporter)
    reporter.step(row)
    progress.bad = progress.bad + 1 if row["skipped_updates"] else 0
    if progress.bad >= config.update.max_bad_steps:
        raise RunFailed(
            f"Stopped: {progress.bad} steps in a row had a non-finite loss or gradient (last at step {step + 1}); "
            f"the newest good checkpoint is after step {progress.saved}."
        )
    every = config.checkpoint.every
    stopping = s.dist.any(stop.requested)  # every rank stops at the same step
    if stopping or (every and (step + 1) % every == 0):
        _checkpoint(s, step + 1, before, wall())
        progress.saved = step + 1
    if stopping and step + 1 < config.steps:
        raise KeyboardInterrupt


def _fail(s: Session, exc: RunFailed, progress: _Progress, before: EvalResult | None,
          wall: Callable[[], float]) -> NoReturn:
    """Checkpoint what is consistent, then re-raise `exc` with how to continue."""
    if exc.consistent:  # every rank raised it (dist.agree), so they can still checkpoint together
        done = s.dist.broadcast_object(len(read_run(s.folder.path).metrics) if s.dist.is_main else 0)
        if done > progress.saved:
            _checkpoint(s, done, before, wall())
            progress.saved = done
    if not list_checkpoints(s.folder.path):
        raise RunFailed(f"{exc} No checkpoint was written yet; fix the cause and start again with "
                        f"--overwrite.") from None
    raise RunFailed(f"{exc} Training state after step {progress.saved} is checkpointed; fix the cause and "
                    f"continue with: llmrl train --resume {s.folder.path}") from None


def _finish(s: Session, reporter: Reporter, trackers: Trackers, progress: _Progress, before: EvalResult | None,
            wall: Callable[[], float]) -> Run:
    """Last checkpoint, final evaluation; rank 0 saves the models, summary and curves."""
    config = s.config
    if progress.saved < config.steps:
        _checkpoint(s, config.steps, before, wall())
    after = run_eval(s)
    reporter.evaluated(config.steps, after)
    if after is not None:
        trackers.log(_eval_scalars(after), step=config.steps)
    if not s.dist.is_main:
        s.dist.barrier()  # wait for rank 0 to write the models and the summary
        return Run(s.folder.path, {}, [], None)
    s.folder.save_models(s.stack)
    history = read_run(s.folder.path).metrics
    summary = summarize(config, history, before, after, wall(), s.folder.path)
    s.folder.write_summary(summary)
    draw_curves(s.folder.path)
    trackers.close()
    reporter.end(summary)
    s.dist.barrier()
    return read_run(s.folder.path)


def draw_curves(path: Path) -> None:
    """RUN/curves.png: reward, KL and held-out accuracy vs step. A plotting failure never fails a
    finished run: it becomes a warning (`llmrl plot RUN` can draw it again)."""
    try:
        from ..plots import draw_runs  # late: matplotlib is only needed at the end

        draw_runs([read_run(path)], path / "curves.png")
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"could not draw {path / 'curves.png'}: {exc}", stacklevel=2)
def _eval_scalars(result: EvalResult) -> dict[str, Any]:
    return {"eval_accuracy": result.accuracy, "eval_reward": result.reward_mean}


def _log_samples(s: Session, reporter: Reporter) -> None:
    """The step's sampled completions → completions.jsonl, and to the reporter when it shows them."""
    if s.samples:
        s.folder.log_completions(s.samples)
        show = getattr(reporter, "completions", None)
        if show is not None:
            show(s.samples)


@contextmanager
def _close_on_error(trackers: Any) -> Iterator[None]:
    """Close the trackers when the loop stops with an error; a finished run closes them at its end."""
    try:
        yield
    except BaseException:
        trackers.close()
        raise


def summarize(config: Config, history: list[dict[str, Any]], before: EvalResult | None,
              after: EvalResult | None, wall: float, path: Path) -> dict[str, Any]:
    """summary.json: the run's headline numbers. `*_last` average the last 10 % of steps (≥ 1)."""
    tail = history[-max(1, len(history) // 10):]
    mean = lambda key: (sum(r[key] for r in tail) / len(tail)) if tail and tail[0].get(key) is not None else None  # noqa: E731
    return {
        "algo": config.algo,
        "estimator": config.estimator.name,
        "task": config.data.dataset or config.task,
        "model": config.model.name,
        "seed": config.seed,
        "steps": len(history),
        "eval_accuracy_before": before.accuracy if before else None,
        "eval_accuracy_after": after.accuracy if after else None,
        "eval_reward_before": before.reward_mean if before else None,
        "eval_reward_after": after.reward_mean if after else None,
        "reward_mean_first": history[0]["reward_mean"] if history else None,
        "reward_mean_last": mean("reward_mean"),
        "kl_last": mean("kl"),
        "tokens_total": sum(r["tokens"] for r in history),
        "step_time_s_mean": sum(r["step_time_s"] for r in history) / max(len(history), 1),
        "wall_time_s": wall,
        "peak_rss_mib": peak_rss_mib(),
        "peak_device_mib": peak_device_mib(config.model.device),
        "run_dir": str(path),
    }
