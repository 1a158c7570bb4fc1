"""choose_settings: the settings a run leaves to llmrl, chosen before the model loads so its plan fits the budget.

The plan (plan.py) is made with the settings as they stand: an unset `update.micro_batch_size` counts as
the whole minibatch at once. While its peak exceeds the budget, the first choice below that lowers the peak
is made, the plan made again, and so on; each choice at most once, and only on settings the user did not
set (a recipe, a flag or `--set`: `Config.given`, config/load.py). The order is seconds per byte saved,
cheapest first, from docs/performance.md's GRPO step of Qwen2.5-Coder-0.5B (64 rows × 64 new tokens,
float32, EPYC, 2026-12-05; 81.0 s a step with the defaults):

    1  the hf engine's float copies off       engine.pack_weights=false, engine.merge_lora=false: 1.9 GiB
                                              for generate 22.3 → 32.0 s, 1.12× a step
    2  micro-batches                          update.micro_batch_size = the rows run/update_fit finds room for
                                              (the plan's prediction of it: budget − held over a row's
                                              activations × its slack of 2), down to a divisor of the
                                              minibatch; 8 rows of 32: update 42.0 → 59.5 s, 1.22× a step
    3  the evaluation's batch width           eval.batch_size: the widest whose evaluate phase fits (halving
                                              it costs evaluation only, never a step: 1×)
    4  logits chunks                          model.logits_chunk_mib halved, down to 4 MiB: the update
                                              recomputes a chunk it no longer keeps (the log-softmax is ≈ 7 %
                                              of the update's time: ≈ 1×)
    5  activation checkpointing               update.activation_checkpointing=true: one more forward per
                                              update pass, without prompt sharing: 1.66× a step (144.1 s
                                              with the copies off against ≈ 90.7 s)

The generation's rows have no width of their own (the `hf` engine decodes a step's rows at once). A run's
cost is said as the product of its choices' factors (a step's seconds against its settings as set).

Where the plan still exceeds the budget: with every setting at its most frugal (the copies off, micro-batches
of one row, evaluation one row at a time, 4 MiB chunks, checkpointing), whoever set them, it cannot fit and
is refused (`refusal`) naming the smallest budget that would hold it, that floor's peak + 2 % (the process
part is this process's resident memory, a few MiB from one run to the next), rounded up to a MiB; where the
floor fits, the user's own settings are what exceed it: said in one line and kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..config import Config
from ..config.memory import size_text
from ..errors import ConfigError
from ..models import quantized_cache
from ..models.load import load_failure, model_source, torch_dtype
from ..tasks import Task, task_from_config
from .plan import RUNTIME, MemoryPlan, plan_run, resident_bytes
from .shape import read_shape
from .sources import longest_prompt, reward_parts

Planner = Callable[[Config], MemoryPlan]
COPIES = ("engine.pack_weights", "engine.merge_lora")
FLOOR_CHUNK_MIB = 4.0  # the smallest logits chunk chosen: 6 positions at a 152k vocabulary
MARGIN = 1.02  # the smallest budget named: the floor's peak + 2 % (module docstring)
COST = {"copies": 1.12, "update.micro_batch_size": 1.22, "eval.batch_size": 1.0, "model.logits_chunk_mib": 1.0,
        "update.activation_checkpointing": 1.66}  # × a step's seconds (module docstring)


@dataclass(frozen=True)
class Choice:
    """The settings a run takes (`config`), its plan, what was chosen ((key, value), in order), the keys the
    user set that keep the plan over the budget, and `smallest`: the least budget that holds the run at its
    most frugal settings (`floor`, bytes: the peak at them)."""
    config: Config
    plan: MemoryPlan
    chosen: tuple[tuple[str, Any], ...]
    kept: tuple[tuple[str, Any], ...]
    floor: int
    source: str

    @property
    def fits(self) -> bool:
        return self.plan.peak_bytes <= self.plan.budget

    @property
    def possible(self) -> bool:
        """Whether the plan fits, or would at the most frugal settings."""
        return self.fits or self.floor <= self.plan.budget

    @property
    def smallest(self) -> int:
        """The budget named when it cannot fit: the floor's peak + 2 %, rounded up to a MiB."""
        return math.ceil(self.floor * MARGIN / 2**20) * 2**20


def given(config: Config) -> frozenset[str]:
    """The keys a recipe, flag or `--set` gave (config/load.py); every key where the config does not say."""
    keys = getattr(config, "given", None)
    return _all_keys() if keys is None else frozenset(keys)


def _all_keys() -> frozenset[str]:
    return frozenset({*COPIES, "update.micro_batch_size", "eval.batch_size", "model.logits_chunk_mib",
                      "update.activation_checkpointing"})


def _value(config: Config, key: str) -> Any:
    section, _, leaf = key.partition(".")
    return getattr(getattr(config, section), leaf)


def with_settings(config: Config, changes: dict[str, Any]) -> Config:
    """`config` with the dotted keys of `changes` set (`given` carried over)."""
    out = config
    for key, value in changes.items():
        section, _, leaf = key.partition(".")
        out = replace(out, **{section: replace(getattr(out, section), **{leaf: value})})
    if hasattr(config, "given"):
        object.__setattr__(out, "given", config.given)
    return out


def _minibatch(config: Config) -> int:
    r = config.rollout
    return min(config.update.minibatch_size, r.prompts_per_step * r.num_generations)


def as_set(config: Config) -> Config:
    """The settings as they stand: an unset micro-batch size is the whole minibatch at once."""
    unset = config.update.micro_batch_size is None
    return with_settings(config, {"update.micro_batch_size": _minibatch(config)}) if unset else config


def _widest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [lo, hi] with fits(n) (monotone: fits(n) implies fits(n − 1)); lo where none does."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _copies(config: Config, plan: Planner, allowed: frozenset[str]) -> dict[str, Any]:
    return {k: False for k in COPIES if k in allowed and _value(config, k)}


def _micro(config: Config, plan: Planner, allowed: frozenset[str]) -> dict[str, Any]:
    """m: the rows the fit would find room for (the plan with the size unset predicts them), down to a divisor
    of the minibatch: micro-batches of equal rows, and a choice that a few MiB more or less of the process
    part (measured when the plan is made) seldom moves."""
    if "update.micro_batch_size" not in allowed or config.update.on_policy_values == "on":  # one pass: no micro-batches
        return {}
    unset = with_settings(config, {"update.micro_batch_size": None})
    target = plan(unset).phase_bytes("update")
    size = lambda m: with_settings(config, {"update.micro_batch_size": m})  # noqa: E731
    m = _widest(1, _minibatch(config), lambda m: plan(size(m)).phase_bytes("update") <= target)
    m = max(d for d in range(1, m + 1) if _minibatch(config) % d == 0)  # equal micro-batches
    return {"update.micro_batch_size": m} if m < config.update.micro_batch_size else {}


def _eval_width(config: Config, plan: Planner, allowed: frozenset[str]) -> dict[str, Any]:
    width = min(config.eval.batch_size, config.eval.size)
    if "eval.batch_size" not in allowed or width <= 1:
        return {}
    at = lambda w: with_settings(config, {"eval.batch_size": w})  # noqa: E731
    w = _widest(1, width, lambda w: plan(at(w)).phase_bytes("evaluate") <= plan(at(w)).budget)
    return {"eval.batch_size": w} if w < width else {}


def _chunks(config: Config, plan: Planner, allowed: frozenset[str]) -> dict[str, Any]:
    """The largest of the chunk halved (64 for 0, the whole batch), down to FLOOR_CHUNK_MIB, that fits."""
    now = config.model.logits_chunk_mib or 128.0
    sizes = [now / 2**k for k in range(1, 16) if now / 2**k >= FLOOR_CHUNK_MIB]
    if "model.logits_chunk_mib" not in allowed or not sizes:
        return {}
    at = lambda mib: with_settings(config, {"model.logits_chunk_mib": mib})  # noqa: E731
    chosen = next((mib for mib in sizes if plan(at(mib)).peak_bytes <= plan(at(mib)).budget), sizes[-1])
    return {"model.logits_chunk_mib": chosen}


def _checkpointing(config: Config, plan: Planner, allowed: frozenset[str]) -> dict[str, Any]:
    key = "update.activation_checkpointing"
    return {key: True} if key in allowed and not config.update.activation_checkpointing \
        and not config.dist.shard_base else {}  # a sharded base's hooks would not run in a recompute


CHOICES = (("copies", _copies), ("update.micro_batch_size", _micro), ("eval.batch_size", _eval_width),
           ("model.logits_chunk_mib", _chunks), ("update.activation_checkpointing", _checkpointing))


def _floor(config: Config, plan: Planner) -> MemoryPlan:
    """The plan at every setting's most frugal value, whoever set it."""
    frugal = {**{k: False for k in COPIES}, "update.micro_batch_size": 1, "eval.batch_size": 1,
              "model.logits_chunk_mib": min(config.model.logits_chunk_mib or FLOOR_CHUNK_MIB, FLOOR_CHUNK_MIB)}
    if not config.dist.shard_base:
        frugal["update.activation_checkpointing"] = True
    return plan(with_settings(config, frugal))


def choose_settings(config: Config, plan: Planner, source: str) -> Choice:
    """The run's settings and plan against the budget `plan` is made for (module docstring)."""
    allowed = _all_keys() - given(config)
    current, chosen, done = as_set(config), {}, set()
    now = plan(current)
    while now.peak_bytes > now.budget:
        for name, choice in CHOICES:
            change = {} if name in done else choice(current, plan, allowed)
            trial = with_settings(current, change) if change else None
            if trial is not None and plan(trial).peak_bytes < now.peak_bytes:
                current, now, chosen = trial, plan(trial), {**chosen, **change}
                done.add(name)
                break
        else:
            break
    if not chosen:  # nothing chosen: the settings as the user gave them (an unset size stays the fit's)
        current, now = config, plan(config)
    kept = tuple((k, _value(config, k)) for k in sorted(_all_keys() & given(config))
                 if now.peak_bytes > now.budget)
    return Choice(current, now, tuple(chosen.items()), kept, _floor(config, plan).peak_bytes, source)


def copy_bytes(config: Config, source: str) -> int:
    """The bytes a 4-bit run reads where an earlier run left its 4-bit copy (models/quantized_cache.py): the
    copy's safetensors files, not the float checkpoint; 0 where there is none (or the run is not 4-bit)."""
    if config.model.quantize == "none":
        return 0
    dtype = str(torch_dtype(config.model.dtype, config.model.device, config.model.name)).removeprefix("torch.")
    copy = quantized_cache.cached(source, config.model.quantize, dtype)
    return sum(f.stat().st_size for f in copy.glob("*.safetensors")) if copy is not None else 0


def planner(config: Config, budget: Any, task: Task | None = None, world: int = 1) -> Planner:
    """Plans of `config` with other memory settings, against `budget`: the model's shape, the longest prompt,
    the reward models and this process's resident memory gathered once (sources.plan_memory's inputs)."""
    source, _ = model_source(config.model, show_progress=False)
    try:  # a config.json transformers cannot read: the sentence loading it would say, before it is tried
        shape = read_shape(source, config.model.trust_remote_code)
    except Exception as exc:  # transformers raises many kinds for a broken file (models/load.load_base)
        raise ConfigError(f"Cannot load model '{config.model.name}' as a causal LM: {load_failure(exc, source)}") from None
    shape = replace(shape, file_bytes=copy_bytes(config, source) or shape.file_bytes)
    prompt = longest_prompt(config, task if task is not None else task_from_config(config), source)
    extra, baseline = reward_parts(config), resident_bytes() + RUNTIME
    return lambda c: plan_run(c, budget, shape=shape, prompt_tokens=prompt, baseline=baseline, world=world,
                              extra=extra)


def choose(config: Config, budget: Any, task: Task | None = None, world: int = 1) -> Choice:
    """choose_settings for a run about to load: its planner built here (reads no weight)."""
    return choose_settings(config, planner(config, budget, task, world), str(budget.source))


def _settings(pairs: tuple[tuple[str, Any], ...]) -> str:
    text = [f"{k}={str(v).lower() if isinstance(v, bool) else f'{v:g}' if isinstance(v, float) else v}"
            for k, v in pairs]
    return ", ".join(text[:-1]) + (" and " if len(text) > 1 else "") + text[-1]


def cost(choice: Choice) -> float:
    """× a step's seconds: the product of the chosen settings' factors (module docstring)."""
    names = {"copies" if k in COPIES else k for k, _ in choice.chosen}
    return math.prod(COST[n] for n in names)


def line(choice: Choice) -> str | None:
    """The one line a run says of its memory: what was chosen and its cost, or the user's settings that keep
    the plan over the budget; None where the settings as given fit, or where the run is refused."""
    if not choice.possible:
        return None
    budget = f"{size_text(choice.plan.budget)} ({choice.source})"
    peak = f"{size_text(choice.plan.peak_bytes)} ({choice.plan.peak_phase})"
    if choice.chosen and choice.fits:
        return (f"memory: {budget} holds this run, predicted peak {peak}, with {_settings(choice.chosen)} "
                f"(≈ {cost(choice):.2f}× the seconds of a step); set them to choose otherwise.")
    if not choice.fits:
        given_ = f" with the settings given ({_settings(choice.kept)})" if choice.kept else ""
        return (f"memory: this run may not fit in memory{given_}: its plan peaks at {peak}, more than {budget}"
                f"{'; llmrl chose ' + _settings(choice.chosen) if choice.chosen else ''}; the run goes on as set.")
    return None


def refusal(choice: Choice) -> ConfigError | None:
    """The one sentence of a run that cannot fit even at its most frugal settings (None where it can)."""
    if choice.possible:
        return None
    mib = choice.smallest // 2**20
    return ConfigError(
        f"This run cannot fit in {size_text(choice.plan.budget)} ({choice.source}) even with micro-batches of one "
        f"row, evaluation one row at a time, the engine's float copies off, {FLOOR_CHUNK_MIB:g} MiB logits chunks "
        f"and activation checkpointing: the smallest budget that holds it is {size_text(choice.smallest)} "
        f"(--max-memory {mib}MiB); fewer rows or new tokens, or model.quantize=nf4, need less.")
