"""The model card of a reward model's export, README.md: what it scores, how llmrl trained it, what it reached.

Metadata as card.py's (`base_model` the hub id where names.py knows one, `library_name: llmrl`, the licence
where the catalogue knows it), with `pipeline_tag: text-classification` and the tag `reward-model`. The text
says what the model computes (one number r per text, the score head at the last token that is not padding),
which text it reads for a (prompt, answer) pair, the held-out pairs' figures summary.json holds (every
`X_before` beside its `X_after`: pairwise accuracy, mean margin, …), the settings of config.yaml that shape
the result, and a snippet that loads the folder and scores two texts. Local paths appear by their last part
only (names.py). Nothing is measured again: the card reports what the run wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..config.reward_run import RewardRunConfig
from ..config.schema import ModelConfig
from .card import four_bit_base
from .names import base_model, public_name

TEXTS = ("2+3=5", "2+3=6")  # the snippet's two texts


def _number(key: str, value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    return f"{value:.1%}" if "accuracy" in key else f"{value:.4g}"


def held_out(summary: dict[str, Any] | None) -> str:
    """summary.json's before → after figures as a Markdown table, or a sentence saying there are none."""
    if not summary:
        return "The run wrote no summary.json (it did not finish), so there are no held-out figures."
    keys = sorted(k.removesuffix("_after") for k in summary if k.endswith("_after") and f"{k[:-6]}_before" in summary)
    if not keys:
        return "The run's summary.json holds no held-out figures."
    keys.sort(key=lambda k: ("accuracy" not in k, "margin" not in k, k))

    def count(key: str) -> str:
        return f"{summary[key]} " if isinstance(summary.get(key), int) else ""

    trained = (f" Trained on {count('train_pairs')}pairs in {summary['steps']} optimizer steps."
               if isinstance(summary.get("steps"), int) else "")
    lines = [f"The {count('held_out_pairs')}held-out preference pairs, as the run scored them before and after "
             f"training (accuracy: the share with r(chosen) > r(rejected)).{trained}", "",
             "| metric | base (before training) | trained |", "|---|---|---|"]
    for key in keys:
        lines.append(f"| {key.removeprefix('eval_')} | {_number(key, summary[f'{key}_before'])} | "
                     f"{_number(key, summary[f'{key}_after'])} |")
    return "\n".join(lines)


def settings(config: RewardRunConfig) -> list[tuple[str, str]]:
    """The settings that shape the result, as (name, value) rows."""
    p, rm, lora = config.pairs, config.rm, config.lora
    held = (f"`{public_name(p.eval_dataset)}`" if p.eval_dataset
            else f"{p.eval_fraction:.0%} of the pairs (split seed {p.split_seed})")
    loss = "Bradley–Terry, −log σ(r_w − r_l" + (f" − m), margins from `{p.margin_column}`" if p.margin_column else ")")
    if rm.center_coefficient:
        loss += f", reward centering {rm.center_coefficient:g}·mean((r_w + r_l)²)"
    return [
        ("preference pairs", f"`{public_name(p.dataset)}`" if p.dataset else "—"),
        ("held-out pairs", held),
        ("loss", loss),
        ("epochs", f"{rm.epochs:g}"),
        ("pairs per step", str(rm.batch_size)),
        ("learning rate", f"{rm.lr:g}, {rm.lr_schedule}" + (f", warm-up {rm.warmup_ratio:g}" if rm.warmup_ratio else "")),
        ("LoRA", f"r {lora.r}, α {lora.alpha:g}, dropout {lora.dropout:g}"
                 + (f", modules_to_save {', '.join(lora.modules_to_save)}" if lora.modules_to_save else "")),
        ("base weights", config.model.dtype + (f", {config.model.quantize} 4-bit" if config.model.quantize != "none" else "")),
        ("seed", str(config.seed)),
    ]


def snippet(model: ModelConfig, pad_id: int | None, kind: str, title: str) -> str:
    """Python that loads the export by `title` (its repository id or folder name) and scores two texts."""
    lines = ["import torch"]
    if kind == "adapter":
        repo = base_model(model.name)[0] or "BASE"
        quant = f", quantization_config={four_bit_base(model)}" if model.quantize != "none" else ""
        lines += ["from peft import PeftModel",
                  "from transformers import AutoModelForSequenceClassification, AutoTokenizer"
                  + (", BitsAndBytesConfig" if quant else ""), "",
                  f'base = AutoModelForSequenceClassification.from_pretrained("{repo}", num_labels=1, '
                  f"pad_token_id={pad_id}{quant})",
                  f'model = PeftModel.from_pretrained(base, "{title}").eval()']
    else:
        lines += ["from transformers import AutoModelForSequenceClassification, AutoTokenizer", "",
                  f'model = AutoModelForSequenceClassification.from_pretrained("{title}").eval()']
    lines += [f'tokenizer = AutoTokenizer.from_pretrained("{title}")',
              f"texts = {list(TEXTS)!r}",
              'batch = tokenizer(texts, return_tensors="pt", padding=True)',
              "with torch.no_grad():",
              "    scores = model(**batch).logits[:, 0]  # one score per text: the higher, the more preferred",
              "print(scores)"]
    return "```python\n" + "\n".join(lines) + "\n```"


def what_it_is(model: ModelConfig, kind: str, dtype: str) -> str:
    """What the folder holds and which base it belongs to (a 4-bit run's: the de-quantised or the 4-bit base)."""
    four = model.quantize
    if kind == "adapter":
        text = ("This folder is the reward model's peft LoRA adapter with its score head (peft's `SEQ_CLS` format): load "
                "the base as a sequence classifier of one label with the pad token's id, then "
                "`PeftModel.from_pretrained(base, THIS_FOLDER)`.")
        if base_model(model.name)[0] is None:
            text += " The base is not on the hub: put its folder in place of `BASE`."
        if four != "none":
            text += (f" The run trained on the base loaded in 4 bits ({four}): applied to the base's float weights "
                     f"the adapter computes another reward model than the one trained and evaluated here.")
        return text
    text = (f"The LoRA adapter is merged into the base weights ({dtype}) and the score head is the model's `score`: "
            f"`AutoModelForSequenceClassification.from_pretrained(THIS_FOLDER)` loads it without llmrl or peft.")
    if four != "none":
        text += (f" The run trained on the base loaded in 4 bits (`{four_bit_base(model)}`): the adapter is "
                 f"merged into the de-quantised {four} weights, W = deq(W_q) + s·B·A, so the folder holds plain "
                 f"weights, no 4-bit layer.")
    return text


def _summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        found = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def reward_card(run_dir: Path, model: ModelConfig, config: RewardRunConfig | None, pad_id: int | None, kind: str,
                dtype: str, title: str) -> ModelCard:
    """The card of an export of the reward run in `run_dir` (its base `model`, its config where it kept one, the
    pad token it scored with; `kind` 'merged' or 'adapter', weights in `dtype`) headed `title`."""
    repo, base_text, licence = base_model(model.name)
    data: dict[str, Any] = {"library_name": "llmrl", "pipeline_tag": "text-classification",
                            "tags": ["llmrl", "reward-model", "peft" if kind == "adapter" else "transformers"]}
    if repo:
        data["base_model"] = repo
    if licence:
        data["license"] = licence
    pad = f" (id {pad_id})" if pad_id is not None else ""
    trained = (f"\n## Training\n\n| setting | value |\n|---|---|\n"
               + "\n".join(f"| {n} | {v} |" for n, v in settings(config)) + "\n") if config else ""
    body = (f"# {title}\n\n"
            f"A reward model on {base_text}, trained by llmrl from preference pairs (chosen over rejected answers). "
            f"It reads a text and gives one number, r = w · h: the score head w applied to the last hidden state h at "
            f"the rightmost token that is not the pad token{pad}, transformers' rule for every "
            f"`…ForSequenceClassification`; the higher, the more preferred. {what_it_is(model, kind, dtype)}\n\n"
            f"For a prompt and an answer the text is `prompt + answer`; for a conversation, the tokenizer's chat "
            f"template over the messages with the answer as the assistant's last message. Pad on the right (the saved "
            f"tokenizer does), never truncate.\n\n"
            f"## Usage\n\n{snippet(model, pad_id, kind, title)}\n\n"
            f"## Held-out evaluation\n\n{held_out(_summary(run_dir))}\n{trained}")
    return ModelCard(f"---\n{ModelCardData(**data).to_yaml()}\n---\n\n{body}")
