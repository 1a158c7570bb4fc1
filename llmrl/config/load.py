"""Load, merge and validate a run's configuration.

Precedence, lowest first: dataclass defaults < the algorithm's preset < the model's own
recommendations (`model_defaults.py`: the built-in tiny's, or a real model's for its device) < the recipe file < flags and `--set key=value` overrides. The result is a frozen `Config`; every user mistake becomes a
`ConfigError` naming the key (with the closest valid key when it is unknown).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError
from .domains import check_domain
from . import precision
from .model_defaults import default_minibatch, defaults_for_model, device_kind
from .on_policy import exactly_on_policy, not_on_policy, on_policy_values
from .schema import Config, ModelConfig


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def field_types(cls: type = Config, prefix: str = "") -> dict[str, tuple[Any, dataclasses.Field]]:
    """Dotted key → (annotation, field) for every leaf setting of `cls`."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, dataclasses.Field]] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            out.update(field_types(tp, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (tp, f)
    return out


@functools.cache
def _sections(root: type = Config) -> frozenset[str]:
    """The root's section names (model, lora, …), resolved once: `get_type_hints` evaluates every
    annotation anew, and `llmrl compare` flattens each run's config many times."""
    hints = typing.get_type_hints(root)
    return frozenset(f.name for f in dataclasses.fields(root) if _is_section(hints[f.name]))


def flatten(tree: Mapping[str, Any], prefix: str = "", root: type = Config) -> dict[str, Any]:
    """{'update': {'lr_actor': 1}} → {'update.lr_actor': 1}; sections are the keys of `root` (Config, or a
    reward run's RewardRunConfig)."""
    sections = _sections(root)
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and not prefix and key in sections:
            flat.update(flatten(value, f"{path}.", root))
        else:
            flat[path] = value
    return flat


def _closest(key: str, root: type = Config) -> str:
    keys = list(field_types(root))
    match = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if not match:  # try the last component alone: `lr_actor` → `update.lr_actor`
        leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(leaf), n=1, cutoff=0.6)
        match = [leaf[hit[0]]] if hit else []
    return f"; did you mean '{match[0]}'?" if match else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`, converting int → float and 'x,y' → list."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(key, value, inner[0])
    if origin is list and typing.get_args(tp)[:1] == (float,):
        return _coerce_numbers(key, value)
    if origin is list and typing.get_args(tp)[:1] != (str,):
        return _coerce_specs(key, value)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"'{key}' must be a list of strings, got {value!r}.")
        return list(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"'{key}' must be true or false, got {value!r}.")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"'{key}' must be a finite number, got {value!r}.")
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"'{key}' must be {_type_name(tp)}, got {value!r}.")
    return value


def _coerce_numbers(key: str, value: Any) -> list[float]:
    """A list of finite numbers; a string 'a,b' is split at the commas (`--set update.is_band=0.5,2`),
    a lone number is a list of one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        try:
            value = [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"'{key}' must be a list of numbers, got {value!r}.") from None
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"'{key}' must be a list of numbers, got {value!r}.")
    if not all(math.isfinite(v) for v in value):
        raise ConfigError(f"'{key}' must hold finite numbers, got {value!r}.")
    return [float(v) for v in value]


def _coerce_specs(key: str, value: Any) -> list[dict[str, Any]]:
    """A list of mappings (e.g. reward specs); a bare string 'a,b' or a string item 'a' is {'name': 'a'}."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"'{key}' must be a list of names or mappings, got {value!r}.")
    out = []
    for item in value:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise ConfigError(f"'{key}' must be a list of names or mappings, got item {item!r}.")
        out.append(dict(item))
    return out


def check_bounds(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    """Raise a ConfigError when `value` breaks the field's choices/min/max/gt."""
    if value is None:
        return
    if "each" in meta and any(v not in meta["each"] for v in value):
        bad = next(v for v in value if v not in meta["each"])
        raise ConfigError(f"'{key}' entries must be among {', '.join(meta['each'])}; got {bad!r}.")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"'{key}' must be one of {', '.join(map(str, meta['choices']))}; got {value!r}.")
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"'{key}' must be ≥ {meta['min']}, got {value!r}.")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"'{key}' must be ≤ {meta['max']}, got {value!r}.")
    if "gt" in meta and value <= meta["gt"]:
        raise ConfigError(f"'{key}' must be > {meta['gt']}, got {value!r}.")


def parse_override(item: str) -> tuple[str, Any]:
    """'update.lr_actor=1e-3' → ('update.lr_actor', 0.001); the value is parsed as YAML, except that text
    YAML would read as a one-line block mapping ('Think step by step: then answer.' → {'Think step by
    step': 'then answer.'}) stays the text: a mapping on the command line is written '{a: b}'."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got '{item}'.")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        value = raw
    if isinstance(value, str) and _looks_numeric(value):
        value = float(value)  # YAML 1.1 reads '1e-3' as a string
    return key.strip(), value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key given twice in one mapping is an error (PyYAML
    silently keeps the last one, so `steps: 1` … `steps: 2` would train 2 steps without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # `<<: *anchor` merges may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_recipe(path: str | Path, root: type = Config) -> dict[str, Any]:
    """A recipe file as a flat {dotted key: value} dict of `root`'s settings."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"Recipe file '{p}' is a folder, not a YAML file.")
    if not p.is_file():
        raise ConfigError(f"Recipe file '{p}' does not exist.")
    try:
        tree = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"Recipe file '{p}' is not valid YAML (not UTF-8 text).") from None
    except _DuplicateKey as exc:
        raise ConfigError(f"Recipe file '{p}' sets '{exc.key}' twice (line {exc.line}).") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"Recipe file '{p}' is not valid YAML{where}.") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"Recipe file '{p}' must hold a mapping of settings, not {type(tree).__name__}.")
    return flatten(tree, root=root)


def build(flat: Mapping[str, Any], root: type = Config) -> Any:
    """Validate a flat {dotted key: value} mapping and build the frozen `root` (Config by default)."""
    types_ = field_types(root)
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in flat.items():
        if key not in types_:
            raise ConfigError(f"Unknown setting '{key}'{_closest(key, root)}")
        tp, f = types_[key]
        if isinstance(value, bool) and "bool_words" in f.metadata:  # YAML's on/off/true/false → 'on'/'off'
            value = f.metadata["bool_words"][value]
        value = coerce(key, value, tp)
        check_bounds(key, value, f.metadata)
        check_domain(key, value, tp, f.metadata)
        head, _, leaf = key.partition(".")
        if leaf:
            sections.setdefault(head, {})[leaf] = value
        else:
            top[key] = value
    hints = typing.get_type_hints(root)
    for name, values in sections.items():
        top[name] = hints[name](**values)
    return root(**top)


def load_config(
    recipe: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    sets: list[str] | None = None,
) -> Config:
    """The run's Config: defaults < algo preset < model defaults < recipe < overrides < `--set` items,
    with a dtype 'auto' replaced by this hardware's fastest (config/precision.py), and an
    update.minibatch_size none of the user's layers sets following their rows per step (`default_minibatch`).

    `overrides` holds already-typed values (CLI flags, Python callers); `sets` holds raw
    'key=value' strings.
    """
    from ..algos import preset_for  # late: algos imports the estimator registry

    user: dict[str, Any] = read_recipe(recipe) if recipe else {}
    user.update({k: v for k, v in (overrides or {}).items() if v is not None})
    user.update(dict(parse_override(s) for s in sets or []))
    algo = user.get("algo", Config.algo)
    model = user.get("model.name", ModelConfig.name)
    preset = preset_for(str(algo))
    grouped = int(preset.get("rollout.num_generations", 1)) > 1
    device = str(user.get("model.device", ModelConfig.device))
    own = defaults_for_model(str(model), device, grouped)
    merged = precision.resolve({**preset, **own, **user}, device_kind(device), ModelConfig.dtype, ModelConfig.name)
    config = build(merged)
    if "update.minibatch_size" not in user:  # a default follows the rows the user asked for (model_defaults.py)
        size = default_minibatch(config.rollout.prompts_per_step * config.rollout.num_generations, {**preset, **own})
        config = dataclasses.replace(config, update=dataclasses.replace(config.update, minibatch_size=size))
    _check_consistency(config)
    object.__setattr__(config, "given", frozenset(user))  # keys a recipe, flag or --set gave: memory/choose.py keeps them
    return config


def _check_filter_groups(r: Any) -> None:
    """Dynamic sampling compares the rewards within a group, so it needs groups."""
    if r.filter_groups and r.num_generations < 2:
        raise ConfigError("'rollout.filter_groups' drops groups whose rewards are all equal, which needs "
                          f"rollout.num_generations ≥ 2 (it is {r.num_generations}).")
    if r.max_draws and not r.filter_groups:
        raise ConfigError(f"'rollout.max_draws' ({r.max_draws}) refills the groups rollout.filter_groups drops; "
                          "set rollout.filter_groups=true too.")
    if r.oversample and not r.filter_groups:
        raise ConfigError(f"'rollout.oversample' ({r.oversample}) draws extra prompts for the groups "
                          "rollout.filter_groups drops; set rollout.filter_groups=true too.")
    if r.filter_scale and not r.filter_groups:
        raise ConfigError("'rollout.filter_scale' scales the loss by the share of groups rollout.filter_groups "
                          "keeps; set rollout.filter_groups=true too.")


def _check_consistency(config: Config) -> None:
    """Rules that tie several keys together."""
    rows = config.rollout.prompts_per_step * config.rollout.num_generations
    if config.update.minibatch_size > rows:
        raise ConfigError(
            f"'update.minibatch_size' ({config.update.minibatch_size}) exceeds the rows per step "
            f"(rollout.prompts_per_step × rollout.num_generations = {rows})."
        )
    _check_sampling_and_kl(config)
    _check_quantize(config)
    _check_is_band(config.update.is_band)
    _check_filter_groups(config.rollout)
    if (config.rollout.filter_groups and config.rollout.filter_on == "reward" and config.kl.placement == "reward"
            and config.kl.beta > 0):
        raise ConfigError(f"'rollout.filter_groups' compares a group's rewards before the forwards, but with KL in the "
                          f"reward (kl.placement=reward, kl.beta={config.kl.beta:g}) the estimator sees them minus "
                          "β·KL, known only after; use kl.placement=loss or kl.beta=0 (or rollout.filter_on=score "
                          "to compare the scores alone).")
    if config.update.activation_checkpointing and config.dist.shard_base:
        raise ConfigError("'update.activation_checkpointing' cannot be combined with 'dist.shard_base': a sharded layer "
                          "gathers its weights in hooks that a recomputed forward would not run.")
    if config.update.on_policy_logprobs == "on" and not exactly_on_policy(config):
        raise ConfigError(not_on_policy(config, rows))
    if config.update.on_policy_values == "on" and not on_policy_values(config):
        raise ConfigError(
            "'update.on_policy_values' needs one update pass: update.epochs=1, "
            f"update.minibatch_size={rows} (all rows of a step), no micro-batches and no dist.shard_base."
        )


def _check_sampling_and_kl(config: Config) -> None:
    """Settings whose numbers would be silently wrong (docs/algorithms.md, "Settings llmrl refuses").

    - rollout.top_p < 1: the sampler draws from the nucleus, renormalised, but log π_old and the
      update's log π are those of the full tempered policy, so the ratio π_θ/π_old is not the one
      of the policy that sampled.
    - kl.estimator k1 in the loss: E_{a∼π}[∇(log π − log π_ref)] = Σ_a π ∇log π = ∇Σ_a π = 0, so
      β·k1 adds only noise to the gradient and regularises nothing.
    """
    if config.rollout.top_p < 1:
        raise ConfigError(
            f"'rollout.top_p' is {config.rollout.top_p:g}, but training samples at top_p=1: log π_old and the "
            "update's log π are of the full tempered policy, not of the truncated nucleus, so the PPO ratio would "
            "not be the sampler's; lower rollout.temperature instead."
        )
    if config.kl.estimator == "k1" and config.kl.placement == "loss" and config.kl.beta > 0:
        raise ConfigError(
            "'kl.estimator' k1 with kl.placement=loss regularises nothing: the expected gradient of "
            "log π − log π_ref under the policy's own samples is zero; use kl.estimator=k3 (or k2) in the loss, "
            "or kl.placement=reward."
        )


BUILTIN_NAMES = ("tiny", "tiny-tools", "tiny-guess")  # the built-in models (llmrl/tasks registers their builders)


def _check_quantize(config: Config) -> None:
    """A 4-bit base (model.quantize) where it cannot work: the built-in models (hidden size 64, a
    float32 model of 0.1 M numbers: nothing to save, and their runs are the bit-for-bit baseline), the
    vllm engine (its weight sync pushes merged float tensors W + s·B·A, and its CPU build has no
    bitsandbytes kernels) and a sharded base (FSDP2 shards plain tensors, not 4-bit codes)."""
    kind = config.model.quantize
    if kind == "none":
        return
    if config.model.name in BUILTIN_NAMES:
        raise ConfigError(f"model.quantize={kind} quantizes a real model's linear layers; the built-in "
                          f"'{config.model.name}' model (hidden size 64) has nothing to save: use --model NAME, or model.quantize=none.")
    if config.rollout.engine != "hf":
        raise ConfigError(f"model.quantize={kind} works with rollout.engine=hf only: the vllm engine is synced with "
                          "merged float weights, which a 4-bit base does not have; use rollout.engine=hf.")
    if config.dist.shard_base:
        raise ConfigError(f"model.quantize={kind} cannot be combined with dist.shard_base: FSDP2 shards plain "
                          "tensors, not 4-bit codes; a 4-bit base is small enough to hold whole on each process.")


def _check_is_band(band: list[float]) -> None:
    """`update.is_band` = [low, high] with 0 < low < 1 < high: a band that excludes ρ = 1 would reject
    the tokens on which the sampler and the trainer agree."""
    if len(band) != 2 or not 0 < band[0] < 1 < band[1]:
        raise ConfigError(
            f"'update.is_band' must be [low, high] with 0 < low < 1 < high (a band around the ratio 1), got {band!r}."
        )


def to_tree(config: Config) -> dict[str, Any]:
    """The nested plain-dict form written to config.yaml."""
    return dataclasses.asdict(config)
