"""eval_model: held-out accuracy of a model or a trained run, greedy and pass@k (what `llmrl eval` prints).

    --model RUN_DIR      the run's base + its trained actor adapter (as the trainer evaluated it)
    --model PATH|tiny    the plain model (adapters disabled: the reference role)

The prompts come from `--dataset FILE` (every row of it), else `--task`, else the run's own task
or dataset (its eval split, with its rewards), else the default task. `resolve_task` is the one
place that turns the user's choice into a `Task`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .config import Config, load_config
from .config.domains import check_prose
from .engines import build_engine
from .envs import ENVS, EnvSpec, call_format, resolve_env
from .envs.checks import preflight
from .errors import ConfigError
from .run.actor import load_actor
from .run.reward_role import bind_for_evaluation
from .run.evaluate import evaluate, evaluate_episodes, evaluate_sampled, evaluate_sampled_episodes, with_groups
from .models.load import load_base
from .models.prompts import uses_chat
from .models.stack import PolicyStack
from .models.tokenizer import stop_token_ids
from .run.folder import MARKER
from .tasks import Task, task_from_config, with_task_format


@dataclass
class EvalTarget:
    """The model to evaluate as a stack and a role: 'actor' for a run, 'reference' for a plain model."""

    stack: PolicyStack
    tokenizer: Any
    role: str
    config: Config
    label: str
    is_run: bool


def load_target(model: str, *, device: str | None = None, show_progress: bool = False) -> EvalTarget:
    """A run folder (has config.yaml) → its actor; anything else → the plain model `model`."""
    path = Path(model).expanduser()
    if (path / MARKER).is_file():
        stack, tokenizer, config = load_actor(path, device=device, show_progress=show_progress)
        return EvalTarget(stack, tokenizer, "actor", config, f"run {path} (actor)", True)
    config = load_config(overrides={"model.name": model, "model.device": device})
    base, tokenizer = load_base(config.model, show_progress=show_progress)
    stack = PolicyStack(base, config.lora, with_critic=False)
    return EvalTarget(stack, tokenizer, "reference", config, f"model {model}", False)


def resolve_task(task: str | None, target: EvalTarget, dataset: str | None = None,
                 reward: str | None = None, system_prompt: str | None = None) -> Task:
    """The evaluation task.

    `dataset`: every row of that file (or hub dataset) is an eval row, scored by `reward` or, for a
    run, by the run's own `reward.functions`. `task`: a built-in task. Neither: the run's own task
    or dataset split (`task_from_config` of its config), or the default task for a plain model.
    `system_prompt` replaces data.system_prompt (the run's, or none for a plain model): the system
    message put first in each prompt, which needs the model's chat template.
    """
    cfg = target.config
    if system_prompt is not None:
        check_prose("--system-prompt", system_prompt)
        if not uses_chat(target.tokenizer):
            raise ConfigError(f"--system-prompt needs a chat template to render it, and the {target.label} has none; "
                              "drop the option or evaluate a chat model.")
        cfg = replace(cfg, data=replace(cfg.data, system_prompt=system_prompt))
    if reward is not None:
        cfg = replace(cfg, reward=replace(cfg.reward, functions=[reward]))
    if dataset is not None:
        cfg = replace(cfg, data=replace(cfg.data, dataset=dataset, eval_dataset=dataset))
    elif task is not None:  # the task's own reward unless --reward names one
        cfg = replace(cfg, task=task, data=replace(cfg.data, dataset=None, eval_dataset=None),
                      reward=cfg.reward if reward is not None else replace(cfg.reward, functions=None))
        if task != target.config.task:  # another task: the run's rg:NAME settings and mixture are not its
            cfg = replace(cfg, rg=replace(cfg.rg, config=None), mix=replace(cfg.mix, tasks=None))
    return task_from_config(cfg)


def _no_prompts(chosen: Task, target: EvalTarget) -> str:
    """Why there is nothing to score: no held-out split at all, or a run trained with eval.size=0."""
    if not chosen.eval:
        return (f"Task '{chosen.name}' has no held-out split (data.eval_fraction is 0 and there is no "
                "data.eval_dataset); score a file with --dataset FILE.")
    return (f"The {target.label} was trained with eval.size=0, so it has no held-out prompts to score; pass "
            f"--size N to score the first N of its {len(chosen.eval)} held-out rows, or --dataset FILE.")


def eval_model(
    model: str,
    *,
    task: str | None = None,
    dataset: str | None = None,
    reward: str | None = None,
    samples: int = 4,
    size: int | None = None,
    seed: int = 0,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    batch_size: int | None = None,
    device: str | None = None,
    show_progress: bool = False,
    env: str | None = None,
    tool_format: str | None = None,
    system_prompt: str | None = None,
) -> dict[str, Any]:
    """Greedy accuracy and mean reward on the task's eval split (first `size` rows; with `dataset`,
    the file's first rows, which may be rows a run trained on: `prompts_from` says which), and with
    `samples` K > 0 the mean sampled reward, pass@1 and pass@K (unbiased, n = K). JSON-ready.

    Defaults come from the run's config (or the default config for a plain model): eval.size,
    rollout.max_new_tokens, rollout.temperature, rollout.top_p, eval.batch_size, data.system_prompt.

    Episodes (docs/environments.md) when an environment applies: `env`, else the run's rollout.env,
    else the task's own (calc, guess, ta:ENV_ID); rollout.max_turns and the other episode limits come
    from the run's config; the call format is `tool_format`, else the run's rollout.tool_format where the run set
    one, else the evaluated task's own (a run that left it 'auto' keeps 'auto' in its config.yaml, so `--task
    chat_calc_json` reads json calls whatever the run trained on), else hermes or plain by the chat template. The
    report then adds tool_format (the one read), turns_mean and tool_calls_per_episode.
    """
    target = load_target(model, device=device, show_progress=show_progress)
    cfg = target.config
    chosen = resolve_task(task, target, dataset, reward, system_prompt)
    bind_for_evaluation(chosen, cfg)  # a reward run among its rewards scores as a separate classifier
    rows = chosen.eval[: cfg.eval.size if size is None else size]
    if not rows:
        raise ConfigError(_no_prompts(chosen, target))
    n_new = max_new_tokens or cfg.rollout.max_new_tokens
    batch = batch_size or cfg.eval.batch_size
    engine = build_engine(cfg.rollout.engine, stack=target.stack, tokenizer=target.tokenizer, config=cfg)
    spec = _environment(env, cfg, chosen)
    if spec is not None:
        return _eval_episodes(model, target, chosen, rows, engine, spec, dataset=dataset, samples=samples, seed=seed,
                              temperature=temperature, max_new_tokens=n_new, batch=batch, tool_format=tool_format)
    greedy = evaluate(engine, target.tokenizer, rows, chosen.reward, max_new_tokens=n_new,
                      success=chosen.success, batch_size=batch, role=target.role, metrics=chosen.metrics,
                      stop_ids=stop_token_ids(target.tokenizer, target.stack.lm))
    greedy = with_groups(greedy, rows, chosen)  # a mixture's accuracy per task
    report: dict[str, Any] = {
        "model": model, "evaluated": target.label, "task": chosen.name, "prompts": len(rows),
        "prompts_from": f"the first {len(rows)} rows of {dataset}" if dataset is not None else "the held-out split",
        "greedy": {"accuracy": greedy.accuracy, "reward_mean": greedy.reward_mean, **greedy.metrics},
    }
    if samples > 0:
        temp = cfg.rollout.temperature if temperature is None else temperature
        sampled = evaluate_sampled(engine, target.tokenizer, rows, chosen.reward, samples=samples,
                                   max_new_tokens=n_new, temperature=temp, top_p=cfg.rollout.top_p, seed=seed,
                                   success=chosen.success, batch_size=batch, role=target.role)
        report["sampled"] = {"samples": samples, "temperature": temp, "seed": seed,
                             "reward_mean": sampled.reward_mean,
                             **{f"pass@{k}": v for k, v in sampled.pass_at.items()}}
    return report


def _environment(name: str | None, cfg: Config, task: Task) -> EnvSpec | None:
    """The environment of the evaluation: --env, else the run's rollout.env, else the task's own. One is
    built and its tools() checked before any episode, as `llmrl train` does (envs/checks.preflight: exit 2)."""
    chosen = name or cfg.rollout.env or task.env
    if chosen is None:
        return None
    spec = resolve_env(chosen, timeout_s=cfg.rollout.tool_timeout_s) if chosen in ENVS else resolve_env(chosen)
    preflight(spec)
    return spec


def _eval_episodes(model: str, target: EvalTarget, chosen: Task, rows: list[dict[str, Any]], engine: Any,
                   spec: EnvSpec, *, dataset: str | None, samples: int, seed: int, temperature: float | None,
                   max_new_tokens: int, batch: int, tool_format: str | None = None) -> dict[str, Any]:
    """`eval_model` in episodes: greedy episodes, and K sampled ones per row for pass@k."""
    cfg = target.config
    rollout = replace(with_task_format(cfg.rollout, chosen), max_new_tokens=max_new_tokens,
                      temperature=cfg.rollout.temperature if temperature is None else temperature)
    if tool_format is not None:
        rollout = replace(rollout, tool_format=tool_format)
    stop_ids = stop_token_ids(target.tokenizer, target.stack.lm)
    context = getattr(target.stack.lm.config.get_text_config(), "max_position_embeddings", None)
    greedy = evaluate_episodes(engine, target.tokenizer, spec, rows, chosen.reward, cfg=rollout, success=chosen.success,
                               batch_size=batch, metrics=chosen.metrics, stop_ids=stop_ids, context=context,
                               role=target.role)
    greedy = with_groups(greedy, rows, chosen)  # a mixture's accuracy per task, the environment's rewards counted
    report: dict[str, Any] = {
        "model": model, "evaluated": target.label, "task": chosen.name, "env": spec.name,
        "tool_format": call_format(target.tokenizer, rollout.tool_format), "prompts": len(rows),
        "prompts_from": f"the first {len(rows)} rows of {dataset}" if dataset is not None else "the held-out split",
        "greedy": {"accuracy": greedy.accuracy, "reward_mean": greedy.reward_mean, **greedy.metrics},
    }
    if samples > 0:
        sampled = evaluate_sampled_episodes(engine, target.tokenizer, spec, rows, chosen.reward, cfg=rollout,
                                            samples=samples, seed=seed, success=chosen.success, batch_size=batch,
                                            stop_ids=stop_ids, context=context, role=target.role)
        report["sampled"] = {"samples": samples, "temperature": rollout.temperature, "seed": seed,
                             "reward_mean": sampled.reward_mean,
                             **{f"pass@{k}": v for k, v in sampled.pass_at.items()}}
    return report
