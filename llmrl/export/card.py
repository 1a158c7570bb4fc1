"""The model card an export carries, README.md: what the model is, how llmrl trained it, what it scored.

Its metadata (the YAML block huggingface_hub's `ModelCard` reads and the hub shows) names the base model
where it is a hub repository (a hub id, a catalogued model's upstream, or the hub id a local copy came
from: names.py), `library_name: llmrl`, the upstream licence where llmrl knows it, and the algorithm as
a tag. The text gives the settings that shape the result (task, algorithm, sizes, learning rate, KL,
LoRA) and the held-out figures of the exported weights: summary.json's before and after for the final
actor, the in-run evaluation of metrics.jsonl (or the summary's after, at the last step) for a
checkpoint, else a sentence saying there is none, over the number of prompts the run decoded
(summary.json's `eval_prompts`, which a small split makes fewer than eval.size). A run on a 4-bit base
says which base the export belongs to: an adapter the base loaded with the run's `BitsAndBytesConfig`,
merged weights the de-quantised 4-bit ones. Local paths appear by their last part only (names.py), so a
pushed card publishes no folder of the machine that trained the run. Nothing here is measured again:
the card reports what the run wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..algos import ALGOS
from ..config import Config
from ..config.schema import ModelConfig
from ..run.actor import ActorSource
from ..run.checkpoint import PATTERN
from ..run.folder import read_run
from .names import base_model, public_name

__all__ = ["base_model", "card", "four_bit_base", "held_out", "settings", "weights_step"]


def four_bit_base(model: ModelConfig) -> str:
    """The `BitsAndBytesConfig` the run loaded its base with (models/quantized.py), as Python a reader can paste."""
    from ..models.load import torch_dtype
    from ..models.quantized import quantization_config

    bnb = quantization_config(model.quantize, torch_dtype(model.dtype, model.device, model.name))
    return (f"BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"{bnb.bnb_4bit_quant_type}\", "
            f"bnb_4bit_compute_dtype={bnb.bnb_4bit_compute_dtype}, "
            f"bnb_4bit_use_double_quant={bnb.bnb_4bit_use_double_quant})")


def usage(model: ModelConfig, kind: str, dtype: str) -> str:
    """How to load the export, and for a run on a 4-bit base which base the adapter belongs to."""
    if model.quantize == "none":
        return ("This folder is the actor's PEFT LoRA adapter: load the base, then "
                "`PeftModel.from_pretrained(base, THIS_FOLDER)`." if kind == "adapter" else
                "The actor's LoRA adapter is merged into the base weights: `AutoModelForCausalLM.from_pretrained("
                "THIS_FOLDER)` loads it without llmrl or peft.")
    bnb, kind4 = four_bit_base(model), model.quantize
    if kind == "adapter":
        return (f"This folder is the actor's PEFT LoRA adapter, trained on the base loaded in 4 bits ({kind4}): load "
                f"the base with `quantization_config={bnb}` (bitsandbytes), then `PeftModel.from_pretrained(base, "
                f"THIS_FOLDER)`. Applied to the base's float weights it computes another model than the one "
                f"trained and evaluated here.")
    return (f"The run trained on the base loaded in 4 bits (`{bnb}`): the actor's LoRA adapter is merged into the "
            f"de-quantised {kind4} weights, W = deq(W_q) + s·B·A, so "
            f"`AutoModelForCausalLM.from_pretrained(THIS_FOLDER)` "
            f"loads plain {dtype} weights, no 4-bit layer, without llmrl, peft or bitsandbytes. They differ from the "
            f"float base's weights plus the adapter by the {kind4} quantisation error.")


def weights_step(source: ActorSource, steps: int) -> int:
    """The step whose weights are exported: the run's last for its final adapter, else the checkpoint's."""
    found = PATTERN.match(source.path.parent.name) if source.kind == "checkpoint" else None
    return int(found.group(1)) if found else steps


def _number(key: str, value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.1%}" if "accuracy" in key or key.endswith("rate") else f"{value:.4g}"


def _figures(values: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('eval_')} {_number(k, v)}" for k, v in values.items() if v is not None)


def prompts(summary: dict[str, Any], size: int) -> str:
    """How many held-out prompts each evaluation decoded: summary.json's `eval_prompts` (the split may hold
    fewer than eval.size), else — a run stopped early, or one from before llmrl recorded it — at most `size`."""
    count = summary.get("eval_prompts")
    return f"{count}" if isinstance(count, int) else f"at most {size}"


def held_out(run_dir: Path, step: int, size: int) -> str:
    """The held-out figures of the weights of `step` as a Markdown table, or a sentence saying there are none."""
    run = read_run(run_dir)
    summary = run.summary or {}
    before = {k.removesuffix("_before"): v for k, v in summary.items() if k.startswith("eval_") and k.endswith("_before")}
    if summary.get("steps") == step:
        at = {k.removesuffix("_after"): v for k, v in summary.items() if k.startswith("eval_") and k.endswith("_after")}
    else:  # a checkpoint: the in-run evaluation after that step, if the run made one (eval.every)
        rows = [r for r in run.metrics if r.get("step") == step and r.get("eval_accuracy") is not None]
        at = {k: v for k, v in rows[-1].items() if k.startswith("eval_")} if rows else {}
    if not _figures(at):
        base = f" (the base's: {_figures(before)})" if _figures(before) else ""
        return f"The run wrote no held-out evaluation of the weights of step {step}{base}."
    lines = [f"Greedy decoding of {prompts(summary, size)} held-out prompts, as the run evaluated them:", "",
             f"| metric | base (step 0) | step {step} |", "|---|---|---|"]
    for key in sorted(set(at) | set(before), key=lambda k: (k not in ("eval_accuracy", "eval_reward"), k)):
        lines.append(f"| {key.removeprefix('eval_')} | {_number(key, before.get(key))} | {_number(key, at.get(key))} |")
    return "\n".join(lines)


def settings(config: Config) -> list[tuple[str, str]]:
    """The settings that shape the result, as (name, value) rows."""
    u, r, kl, lora = config.update, config.rollout, config.kl, config.lora
    clip = f"{u.clip_eps}" + (f" / {u.clip_eps_high} (clip-higher)" if u.clip_eps_high is not None else "")
    rows: list[tuple[str, str]] = [
        ("task", f"`{public_name(config.data.dataset)}` (data.dataset)" if config.data.dataset
                 else f"`{public_name(config.task)}`"),
        ("algorithm", f"`{config.algo}` ({ALGOS[config.algo].paper})" if config.algo in ALGOS else f"`{config.algo}`"),
        ("advantage estimator", f"`{config.estimator.name}`"), ("policy loss", f"`{u.policy_loss}`, clip ε {clip}"),
        ("steps", str(config.steps)), ("prompts × samples per step", f"{r.prompts_per_step} × {r.num_generations}"),
        ("max new tokens", str(r.max_new_tokens)), ("temperature", str(r.temperature)),
        ("learning rate (actor)", f"{u.lr_actor:g}, {u.lr_schedule}"),
        ("update", f"{u.epochs} epoch(s), minibatches of {u.minibatch_size} rows, loss `{u.loss_agg}`"),
        ("KL to the base", "none (β = 0)" if kl.beta == 0 else f"β {kl.beta:g}, `{kl.estimator}` in the {kl.placement}"),
        ("LoRA", f"r {lora.r}, α {lora.alpha:g}, dropout {lora.dropout:g}"
                 + (f", modules_to_save {', '.join(lora.modules_to_save)}" if lora.modules_to_save else "")),
        ("base weights", f"{config.model.dtype}" + (f", {config.model.quantize} 4-bit" if config.model.quantize != "none" else "")),
        ("seed", str(config.seed)),
    ]
    if config.rollout.env:
        rows.insert(1, ("environment", f"`{public_name(config.rollout.env)}`, at most {r.max_turns} turns"))
    if config.reward.functions:
        named = [(f.get("weight", 1), public_name(str(f.get("name") or f.get("model")))) for f in config.reward.functions]
        rows.insert(1, ("reward", " + ".join(f"{weight} · `{name}`" for weight, name in named)))
    return rows


def card(config: Config, run_dir: Path, source: ActorSource, kind: str, dtype: str, title: str) -> ModelCard:
    """The card of an export of `run_dir` (`kind` 'merged' or 'adapter', weights in `dtype`) headed `title`."""
    repo, base_text, licence = base_model(config.model.name)
    step = weights_step(source, config.steps)
    data: dict[str, Any] = {"library_name": "llmrl", "pipeline_tag": "text-generation",
                            "tags": ["llmrl", "reinforcement-learning", config.algo, "peft" if kind == "adapter" else "transformers"]}
    if repo:
        data["base_model"] = repo
    if licence:
        data["license"] = licence
    table = "\n".join(f"| {name} | {value} |" for name, value in settings(config))
    body = (f"# {title}\n\n"
            f"A fine-tune of {base_text}, trained with reinforcement learning by llmrl: "
            f"`{config.algo}` on `{public_name(config.data.dataset or config.task)}`, {dtype} weights of step {step} "
            f"of {config.steps} (from the run's {source.kind}). {usage(config.model, kind, dtype)}\n\n"
            f"## Held-out evaluation\n\n{held_out(run_dir, step, config.eval.size)}\n\n"
            f"## Training\n\n| setting | value |\n|---|---|\n{table}\n")
    return ModelCard(f"---\n{ModelCardData(**data).to_yaml()}\n---\n\n{body}")
