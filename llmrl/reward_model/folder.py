"""A reward run's folder: what marks it (reward.json), its adapter in peft's SEQ_CLS format, its summary and
curves; and the checks that keep reward runs and RL runs apart.

    RUN/reward.json        {"kind": "reward-model", "base", "quantize", "dtype", "pad_token_id", "score"}
    RUN/adapter/           adapter_config.json + adapter_model.safetensors (models/scorer.py) + tokenizer
    RUN/config.yaml        the RewardRunConfig (config/reward_run.py)
    RUN/metrics.jsonl      one row per optimizer step; held-out rows with eval_* keys
    RUN/summary.json       held-out accuracy and margin before → after, seconds, peak memory
    RUN/curves.png         train loss and held-out accuracy against the step
    RUN/checkpoints/       step-N/: the adapter and head, optimizer state, RNG (run/checkpoint.py)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..config.load import build, flatten
from ..config.reward_run import RewardRunConfig
from ..errors import ConfigError, LLMRLError
from ..models.scorer import RewardScorer, save_reward_adapter
from ..run.folder import MARKER, RunFolder, atomic_write, json_lines, to_json

KIND = "reward-model"
INFO = "reward.json"


def is_reward_run(path: Path) -> bool:
    """Whether `path` is a reward run's folder (it holds reward.json, or a config.yaml with an `rm` section)."""
    if (path / INFO).is_file():
        return True
    try:
        tree = yaml.safe_load((path / MARKER).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(tree, dict) and "rm" in tree and "pairs" in tree


def reward_info(path: Path) -> dict[str, Any]:
    """RUN/reward.json, refused in one sentence where it is missing or damaged."""
    try:
        info = json.loads((path / INFO).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"'{path}' has no readable {INFO}: it is not a finished reward run.") from None
    if not isinstance(info, dict) or info.get("kind") != KIND:
        raise ConfigError(f"'{path}/{INFO}' is not an llmrl reward run's.")
    return info


SECTIONS = ("model", "lora", "pairs", "rm")  # top-level entries of every reward run's config.yaml


def stored_config(path: Path) -> RewardRunConfig:
    """The RewardRunConfig a reward run stored; an RL run's folder is refused by name, a config.yaml cut short
    or edited into another shape in one sentence (a resume would train on with defaults for what it lost)."""
    marker = path / MARKER
    if not marker.is_file():
        raise LLMRLError(f"'{path}' is not a reward run folder (no {MARKER}); nothing to resume.")
    try:
        tree = yaml.safe_load(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        tree, why = None, f"it is not valid YAML: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
    else:
        lost = [k for k in SECTIONS if not isinstance(tree, dict) or k not in tree]
        why = f"it lacks {', '.join(lost)}" if lost else None
    if isinstance(tree, dict) and "algo" in tree and not {"pairs", "rm"} & tree.keys():  # run/actor.RESUME_KEYS
        raise LLMRLError(f"'{path}' is an RL run (llmrl train), not a reward run; resume it with "
                         f"`llmrl train --resume {path}`.")
    if why is not None:
        raise LLMRLError(f"'{marker}' is not a whole reward run config ({why}): it was cut short or edited; restore "
                         f"it, or start the reward run again with --overwrite.")
    return build(flatten(tree, root=RewardRunConfig), RewardRunConfig)


def finished(path: Path) -> bool:
    """Whether the reward run in `path` has finished: its model (reward.json) and summary.json are written."""
    return (path / INFO).is_file() and (path / "summary.json").is_file()


def write_reward_run(folder: RunFolder, scorer: RewardScorer, tokenizer: Any, config: RewardRunConfig,
                     base_pointer: str | None) -> None:
    """The finished model: RUN/adapter (peft SEQ_CLS format + tokenizer) and RUN/reward.json."""
    save_reward_adapter(folder.path / "adapter", scorer.peft, scorer.head, base_pointer)
    tokenizer.save_pretrained(str(folder.path / "adapter"))
    info = {"kind": KIND, "base": config.model.name, "quantize": config.model.quantize, "dtype": config.model.dtype,
            "pad_token_id": tokenizer.pad_token_id, "score": "last non-pad token"}
    atomic_write(folder.path / INFO, json.dumps(info, indent=2) + "\n")


def draw_reward_curves(path: Path) -> None:
    """RUN/curves.png: the training loss (per step) and the held-out pairwise accuracy (at each evaluation)."""
    rows = json_lines(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
    train = [r for r in rows if "loss" in r]
    held = [r for r in rows if "eval_accuracy" in r]
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    left.set(xlabel="optimizer step", ylabel="Bradley–Terry loss (train batch)", title="training loss")
    right.plot([r["step"] for r in held], [r["eval_accuracy"] for r in held], marker="o")
    right.set(xlabel="optimizer step", ylabel="pairwise accuracy", title="held-out pairs", ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path / "curves.png", dpi=100)


def write_summary(folder: RunFolder, summary: dict[str, Any]) -> None:
    atomic_write(folder.path / "summary.json", to_json(summary, indent=2) + "\n")
