"""setup: everything a run builds once — task, model stack, engine, plan, optimizers, run folder."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerBase

from ..algos import preset_for
from ..config import Config
from ..config.on_policy import on_policy_update, on_policy_values
from ..engines import GenerationEngine, build_engine, check_engine
from ..envs import ENVS, EnvSpec, call_format, prompt_ids, resolve_env, run_with_limit
from ..envs.checks import build, call_tools, check_opening, check_tools, preflight
from ..errors import ConfigError
from ..estimators import EstimatorSpec, get_estimator, import_user_module
from ..kl_control import KLController
from ..losses import resolve_policy_loss
from ..memory.allocator import set_allocator, tight
from ..memory.budget import run_budget
from ..memory.plan import MemoryPlan
from ..memory.choose import choose, line, refusal
from ..models.load import load_base, resolve_device
from ..models.prompts import apply_chat_setting, tokenize_prompts
from ..models.stack import PolicyStack
from ..models.tokenizer import stop_token_ids
from ..parallel.distributed import SINGLE, DistContext
from ..parallel.stats import shared_evaluation
from ..step.episodes import episode_budget
from ..step.forward import generation_logprobs
from ..step.records import StepPlan
from ..step.update import make_optimizers
from ..tasks import Task, task_from_config, task_slug, with_task_format
from .data import PromptSampler
from .evaluate import EvalResult, evaluate, evaluate_episodes, with_groups
from .folder import ReaderFolder, RunFolder
from .memory import engine_costs, role_costs
from .preflight import check_memory, check_sizes
from .update_fit import fit_update, measure_fit
from .reporting import Reporter
from .reward_role import bind_rewards, critic_start, shared_reward


@dataclass(frozen=True)
class Session:
    """Everything a run sets up once (the optimizers, KL controller, sampler and generator hold the
    state that changes from step to step, and that a checkpoint saves)."""

    config: Config
    task: Task
    tokenizer: PreTrainedTokenizerBase
    stack: PolicyStack
    engine: GenerationEngine
    spec: EstimatorSpec
    plan: StepPlan
    opts: dict[str, torch.optim.Optimizer]
    kl: KLController
    sampler: PromptSampler
    folder: RunFolder
    generator: torch.Generator
    dist: DistContext = SINGLE  # this process's place in a data-parallel run: every collective goes through it
    env: EnvSpec | None = None  # the environment of the run's episodes (rollout.env or the task's); None: one turn
    memory: MemoryPlan | None = None  # the run's memory plan, made before the model loaded (memory/plan.py)


def default_out(config: Config) -> Path:
    task = Path(config.data.dataset).stem if config.data.dataset else task_slug(config.task)
    return Path("runs") / f"{config.algo}-{task}-{datetime.now():%Y%m%d-%H%M%S}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def resolve_estimator(config: Config) -> EstimatorSpec:
    if config.estimator.module:
        import_user_module(config.estimator.module)
    spec = get_estimator(config.estimator.name or preset_for(config.algo)["estimator.name"])
    if spec.needs.groups and config.rollout.num_generations < 2:
        raise ConfigError(f"Estimator '{spec.name}' compares samples of a prompt; set rollout.num_generations ≥ 2.")
    return spec


def episode_env(config: Config, task: Task, dist: DistContext = SINGLE) -> EnvSpec | None:
    """The environment of the run's episodes: `rollout.env`, else the task's own, else None (one turn);
    what the first slice of episodes does not serve yet is refused here (docs/environments.md). One
    environment is built and its tools() checked here, before the run folder exists (envs/checks.py: exit 2)."""
    name = config.rollout.env or task.env
    if name is None:
        return None
    if dist.world_size > 1:
        raise ConfigError(f"Episodes (environment '{name}') do not run with several processes yet; "
                          "docs/environments.md lists what is built.")
    spec = resolve_env(name, timeout_s=config.rollout.tool_timeout_s) if name in ENVS else resolve_env(name)
    preflight(spec)
    return spec


def plan_for(config: Config, spec: EstimatorSpec, stack: PolicyStack, own_weights: bool = False) -> StepPlan:
    """What each step computes, from the estimator's needs and the settings (never an algorithm's name).

    `own_weights`: the engine samples from its own copy of the weights (vLLM), so its log-probs are
    the behaviour policy μ, recorded for the correction, and never serve as log π_old."""
    critic_in_update = spec.needs.critic and on_policy_values(config)
    return StepPlan(reference=config.kl.beta > 0, critic=spec.needs.critic and not critic_in_update,
                    greedy=spec.needs.greedy, critic_in_update=critic_in_update, base_hidden=stack.critic_shortcut,
                    old_logprobs=not on_policy_update(config),
                    from_generation=generation_logprobs(config.rollout, stack.lm.dtype) and not own_weights,
                    behaviour=own_weights)


def setup(config: Config, reporter: Reporter, overwrite: bool = False, resume: bool = False,
          dist: DistContext = SINGLE) -> Session:
    """Load the task and model, build the stack, engine and optimizers, create (or reopen) the run folder."""
    # one process's share of --max-memory or the device's (torchrun's processes share a CPU machine's)
    memory = run_budget(config, resolve_device(config.model.device), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    spec = resolve_estimator(config)
    check_engine(config.rollout.engine, config)
    resolve_policy_loss(config.update.policy_loss, config.update.policy_loss_module, config.update.dual_clip)
    if config.rollout.filter_groups and dist.world_size > 1:
        raise ConfigError("'rollout.filter_groups' runs in one process for now: each process would keep a "
                          "different number of rows and their updates would fall out of step; drop --nproc/torchrun "
                          "or the filter.")
    if config.rollout.prompts_per_step % dist.world_size:
        raise ConfigError(f"'rollout.prompts_per_step' ({config.rollout.prompts_per_step}) must be divisible by "
                          f"the number of processes ({dist.world_size}).")
    task = dist.main_first(lambda: task_from_config(config), local=True)  # a dataset or reward model fills caches once
    # before the weights load (its process part is now): the settings left to llmrl chosen so the plan fits
    choice = dist.broadcast_object(choose(config, memory, task, dist.world_size))  # rank 0's, on every rank
    if (refused := refusal(choice)) is not None:
        raise refused
    dist.main_only(lambda: (said := line(choice)) and print(f"llmrl: {said}", file=sys.stderr))
    config, memory_plan = choice.config, choice.plan
    # before anything large is allocated, where the plan is tight (memory/allocator.py)
    set_allocator(config.memory.allocator, tight=tight(memory_plan.peak_bytes, memory_plan.budget))
    asked = config  # config.yaml keeps rollout.tool_format as asked: 'auto' is the task's own, whatever the task
    config = replace(config, rollout=with_task_format(config.rollout, task))
    env = episode_env(config, task, dist)
    path = dist.broadcast_object(Path(config.out) if config.out else default_out(config))
    folder = dist.main_only(lambda: RunFolder.open(path) if resume else RunFolder.create(path, overwrite))
    folder = folder if folder is not None else ReaderFolder(path)
    if config.threads:
        torch.set_num_threads(config.threads)
    base, tokenizer = dist.main_first(lambda: load_base(config.model, reporter.interactive, memory), local=True)
    check_sizes(config, base.config, base.device, memory)  # before the adapters, sized by lora.r, are built
    check_step_rows(config.rollout.prompts_per_step, len(task.train))
    apply_chat_setting(tokenizer, config.data.chat_template, config.model.name, config.data.system_prompt)
    seed_everything(config.seed)
    shared = shared_reward(task, config)  # a reward run on this base: the fourth role (run/reward_role.py)
    stack = PolicyStack(base, config.lora, with_critic=spec.needs.critic, share_prompts=config.model.share_prompts,
                        logits_chunk_mib=config.model.logits_chunk_mib,
                        activation_checkpointing=config.update.activation_checkpointing,
                        length_buckets=config.model.length_buckets and not config.dist.shard_base,
                        reward=shared.saved if shared else None,
                        critic_from=critic_start(task, config, shared) if spec.needs.critic else None)
    bind_rewards(task, config, stack, tokenizer, shared, lambda line: dist.main_only(
        lambda: print(f"llmrl: {line}", file=sys.stderr)))
    dist.broadcast_parameters([p for role in stack.trainable_roles() for p in stack.parameters_of(role)])
    if config.dist.shard_base:
        from ..parallel.fsdp import shard_base  # late: only runs that ask for it

        dist = shard_base(stack, dist)
    longest = check_context(task, tokenizer, base.config, config.rollout.max_new_tokens,
                            config.engine.max_model_len if config.rollout.engine == "vllm" else None,
                            env=env, rollout=config.rollout)
    engine = build_engine(config.rollout.engine, stack=stack, tokenizer=tokenizer, config=config, dist=dist,
                          longest_prompt=longest,
                          response_tokens=None if env is None else episode_budget(config.rollout))
    costs = role_costs(stack) + engine_costs(engine)
    check_memory(config, costs, base.config, memory)
    if not config.dist.shard_base:  # a sharded base's forward gathers its layers: never one rank alone
        budget = config.rollout.max_new_tokens if env is None else episode_budget(config.rollout)
        fit = measure_fit(config, stack, costs, memory.bytes, longest, budget, dist.world_size)
        config = replace(config, update=fit_update(config.update, fit))
    session = Session(
        config, task, tokenizer, stack, engine, spec, plan_for(config, spec, stack, getattr(engine, "own_weights", False)), make_optimizers(stack, config.update),
        KLController(config.kl.beta, config.kl.adaptive, config.kl.target, config.kl.horizon),
        PromptSampler(len(task.train), config.rollout.prompts_per_step, config.seed), folder,
        torch.Generator().manual_seed(config.seed + 1), dist, env, memory_plan,
    )
    # config.yaml last: from the moment it exists the caller's Ctrl-C handler says how to resume
    # (loop._nothing_trained_yet), so nothing slow may run between this write and the return
    if not resume:  # a resumed run records a new length once its checkpoint is restored (`record_steps`)
        folder.write_config(asked)  # `llmrl eval RUN --task OTHER` then reads OTHER's format (model_eval)
    return session


def check_step_rows(per_step: int, train_rows: int) -> None:
    """Refuse a step of more prompts than the train split holds: it would read a row twice, and both
    copies would be sampled with the same keys, so their group would weigh double (run/data.py)."""
    if train_rows and per_step > train_rows:
        raise ConfigError(f"rollout.prompts_per_step ({per_step}) is larger than the train split ({train_rows} rows), "
                          f"so a step would read a row twice with the same sampling keys; set it to at most {train_rows}.")


def episode_context(s: Session) -> int | None:
    """The most tokens an episode's row (prompt + response) may reach: the model's context window, or
    the vllm engine's max_model_len where that is smaller (an episode ends there, step/episodes.py)."""
    limits = [getattr(s.stack.lm.config.get_text_config(), "max_position_embeddings", None),
              getattr(s.engine, "max_model_len", None)]
    return min((x for x in limits if x), default=None)


def record_steps(folder: RunFolder, config: Config) -> None:
    """Rewrite RUN/config.yaml when the resumed run's `steps` differ from the stored ones (a run
    extended with --steps records its new length: config.yaml stays the recipe of the run)."""
    stored = yaml.safe_load((folder.path / "config.yaml").read_text()) or {}
    if stored.get("steps") != config.steps:
        folder.write_config(config)


def prompt_lengths(rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, split: str,
                   env: EnvSpec | None = None, rollout: Any = None) -> list[int]:
    """Each row's prompt in tokens as the run renders it: the prompt's own tokens, or with an environment
    the episode's opening (`env.reset(row, 0)`) rendered with the tools it offers (step/episodes.py: the
    calculator's schema alone is 654 characters in the Hermes format)."""
    if env is None:
        return [len(ids) for ids in tokenize_prompts(tokenizer, [r["prompt"] for r in rows]).input_ids]
    fmt = call_format(tokenizer, rollout.tool_format)
    out = []
    for i, row in enumerate(rows):
        game = build(env)
        opening, error = run_with_limit(lambda: game.reset(row, 0), {}, rollout.env_timeout_s)  # noqa: B023
        if error is not None:  # the user's environment: one sentence, never a traceback
            raise ConfigError(f"Environment '{env.name}' {error} in reset (row {i} of the {split} split).")
        opening = check_opening(env.name, opening, i, before=True)
        tools = check_tools(env.name, call_tools(env.name, game, before=True, episode=i), before=True, episode=i)
        out.append(len(prompt_ids(tokenizer, opening, tools, fmt)))
    return out


def check_context(task: Task, tokenizer: PreTrainedTokenizerBase, model_config: Any, max_new_tokens: int,
                  engine_limit: int | None = None, env: EnvSpec | None = None, rollout: Any = None) -> int:
    """The longest prompt of the task, in tokens as the run renders it (`prompt_lengths`: with an
    environment, its opening and tools; it sizes the vllm engine's context and KV cache), after
    refusing prompts that cannot fit, with the response, in the model's context window, or in the
    vllm engine's `engine.max_model_len` (`engine_limit`) where that is smaller: vLLM would stop such a
    response at the cap with finish reason 'length' before max_new_tokens (scored as if it had ended,
    missed by truncated_rows and the overlong penalty), or refuse a longer prompt mid-run; an episode
    would end before its first turn and be scored as an empty answer."""
    model_limit = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    limit, where = model_limit, f"the model's context of {model_limit} tokens"
    if engine_limit and (not model_limit or engine_limit < model_limit):
        limit, where = engine_limit, f"the vllm engine's engine.max_model_len of {engine_limit} tokens"
    longest = 0
    for split, rows in (("train", task.train), ("eval", task.eval)):
        if not rows:  # no held-out split (data.eval_fraction=0): tokenizing [] raises
            continue
        lengths = prompt_lengths(rows, tokenizer, split, env, rollout)
        longest = max(longest, *lengths)
        rendered = " as the environment opens it (its tools included)" if env is not None else ""
        for i, n in enumerate(lengths):
            if limit and n + max_new_tokens > limit:
                raise ConfigError(
                    f"Prompt {i} of the {split} split has {n} tokens{rendered}; with rollout.max_new_tokens="
                    f"{max_new_tokens} it exceeds {where}."
                )
    return longest


def run_eval(s: Session) -> EvalResult | None:
    """Greedy accuracy, mean reward and the task's metrics (+ eos_rate, response_len) on the first
    `eval.size` held-out rows (shared by the processes)."""
    rows = s.task.eval[: s.config.eval.size]
    if not rows:
        return None
    env_rewards: list[float] = []  # episodes run in one process (episode_env), so `on` sees every row

    def on(part: Any) -> tuple[float, float, list[str], dict[str, float]]:
        if s.env is not None:  # greedy episodes in the run's environment (tools and all)
            res = evaluate_episodes(s.engine, s.tokenizer, s.env, part, s.task.reward, cfg=s.config.rollout,
                                    success=s.task.success, batch_size=s.config.eval.batch_size, metrics=s.task.metrics,
                                    stop_ids=stop_token_ids(s.tokenizer, s.stack.lm),
                                    context=episode_context(s))
            env_rewards.extend(res.env_rewards or [])
            return res.accuracy, res.reward_mean, res.completions, res.metrics
        res = evaluate(s.engine, s.tokenizer, part, s.task.reward, max_new_tokens=s.config.rollout.max_new_tokens,
                       success=s.task.success, batch_size=s.config.eval.batch_size, metrics=s.task.metrics,
                       stop_ids=stop_token_ids(s.tokenizer, s.stack.lm))
        return res.accuracy, res.reward_mean, res.completions, res.metrics

    result = EvalResult(*shared_evaluation(s.dist, rows, on), env_rewards=env_rewards if s.env is not None else None)
    return with_groups(result, rows, s.task)  # a mixture's accuracy per task
