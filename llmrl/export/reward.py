"""export_reward: a reward run (`llmrl reward train`) → a standalone `AutoModelForSequenceClassification` folder
(or its peft adapter), with a model card.

The merged folder holds the reward model that llmrl scored with, r(x, y) = w · h_ℓ (models/scorer.py), as
transformers' own `…ForSequenceClassification` of the base's architecture: the decoder with every LoRA layer
folded in (W ← W + (α/r)·B·A in float32, `modules_to_save` copies in place of the originals: peft's
`merge_and_unload`), `score` = the run's head w (1, H), no bias, `num_labels` 1 and `pad_token_id` = the one
the run scored with (reward.json), so transformers' rule (the rightmost token that is not padding) picks the
token llmrl's did. The tokenizer pads on the right with that id. Plain transformers loads it
(`AutoModelForSequenceClassification.from_pretrained(DIR)`), and TRL, whose reward models are the same class.
A 4-bit reward run (model.quantize nf4/fp4) merges into deq(W_q) of the base as the run loaded it (its own
model.dtype, its cached 4-bit copy: run/actor.py's way), cast to float32 first.

`--adapter-only` writes RUN/adapter's peft SEQ_CLS files (tensors cast to `--dtype`) with
`base_model_name_or_path` = the base's hub id or null (names.py), the tokenizer and the card: plain peft loads
it onto `AutoModelForSequenceClassification.from_pretrained(BASE, num_labels=1, pad_token_id=…)`.

Written through a temporary sibling folder and one rename, `--out` checked first (output.py).
A reward run whose adapter is missing or damaged, or whose base cannot be loaded, is one sentence, exit 1.
"""

from __future__ import annotations

import copy
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from ..config.reward_run import RewardRunConfig
from ..config.schema import LoraConfig, ModelConfig
from ..errors import LLMRLError
from ..models import quantized_cache
from ..models.load import DTYPES, load_base, model_source
from ..models.quantized import dequantized
from ..models.scorer import RewardScorer, read_reward_adapter
from ..reward_model.folder import reward_info, stored_config
from ..run.folder import MARKER
from .hub import hub_token, push
from .output import Exported, check_out, unquantized, write_export
from .names import point_adapter
from .reward_card import reward_card

ADAPTER_DIR = "adapter"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class RewardRun:
    """What an export reads of a reward run: reward.json, the model it scored on, its config (None where the
    run kept no config.yaml) and its adapter folder."""

    path: Path
    info: dict[str, Any]
    model: ModelConfig
    config: RewardRunConfig | None

    @property
    def adapter(self) -> Path:
        return self.path / ADAPTER_DIR

    @property
    def pad_id(self) -> int | None:
        pad = self.info.get("pad_token_id")
        return pad if isinstance(pad, int) and not isinstance(pad, bool) else None


def failed(exc: LLMRLError) -> LLMRLError:
    """A reward run that cannot be exported (its adapter or base): its sentence, exit 1."""
    return LLMRLError(str(exc), exit_code=1)


def read_reward_run(run_dir: Path) -> RewardRun:
    """reward.json, config.yaml where present (else the base as reward.json names it) and the adapter's files."""
    try:
        info = reward_info(run_dir)
        config = stored_config(run_dir) if (run_dir / MARKER).is_file() else None
    except LLMRLError as exc:
        raise failed(exc) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LLMRLError(f"'{run_dir / MARKER}' cannot be read ({type(exc).__name__}); restore it or export another "
                         f"reward run.", exit_code=1) from None
    model = config.model if config is not None else ModelConfig(
        name=str(info.get("base")), quantize=str(info.get("quantize", "none")), dtype=str(info.get("dtype", "float32")))
    return RewardRun(run_dir, info, model, config)


def loaded_base(run: RewardRun) -> tuple[PreTrainedModel, Any]:
    """The causal LM the run scored on, on the CPU in float32: a 4-bit base as the run loaded it (its own dtype,
    its cached copy), then every 4-bit layer replaced by deq(W_q) (run/actor.py's `load_actor(dequantize=True)`)."""
    four_bit = run.model.quantize != "none"
    cfg = replace(run.model, device="cpu", dtype=run.model.dtype if four_bit else "float32")
    try:
        base, tokenizer = load_base(cfg, show_progress=False)
    except LLMRLError as exc:
        raise failed(LLMRLError(f"The reward run's base cannot be loaded: {exc}")) from None
    if four_bit:
        if quantized_cache.record(base) is None:
            print(f"llmrl: no cached {cfg.quantize} copy of '{cfg.name}' ({cfg.dtype}) was found, so its float "
                  f"checkpoint was quantised again on the cpu: the codes the reward run trained on only if it "
                  f"quantised them there too (model.device: {run.model.device}).", file=sys.stderr)
        base = dequantized(base, torch.float32).to(torch.float32)
    return base, tokenizer


def classifier(merged: PreTrainedModel, head: torch.Tensor, pad_id: int | None) -> PreTrainedModel:
    """transformers' `…ForSequenceClassification` of `merged`'s architecture holding `merged`'s decoder (the
    module itself, no copy: built on the meta device, then given the decoder) and `score` = `head` (1, H)."""
    config = copy.deepcopy(merged.config)
    config.num_labels, config.pad_token_id, config.architectures = 1, pad_id, None
    try:
        with torch.device("meta"):
            seq = AutoModelForSequenceClassification.from_config(config)
    except (ValueError, KeyError) as exc:
        raise LLMRLError(f"transformers has no sequence classifier for the base's architecture "
                         f"({type(merged.config).__name__}: {str(exc).splitlines()[0][:120]}); export with "
                         f"--adapter-only instead.", exit_code=1) from None
    setattr(seq, seq.base_model_prefix, merged.base_model)
    score = nn.Linear(head.shape[1], 1, bias=False, dtype=torch.float32)
    with torch.no_grad():
        score.weight.copy_(head.float())
    seq.score = score
    left = [n for n, t in [*seq.named_parameters(), *seq.named_buffers()] if t.is_meta]
    if left:  # an architecture whose classifier holds more than the decoder and `score`
        raise LLMRLError(f"The base's sequence classifier has parts the reward run did not train ({left[0]}); "
                         f"export with --adapter-only instead.", exit_code=1)
    return seq.eval()


def run_tokenizer(run: RewardRun, fallback: Callable[[], Any]) -> Any:
    """The tokenizer the run saved beside its adapter (else the base's), padding on the right with the id the
    run scored with, so transformers' last-token rule and llmrl's agree."""
    tokenizer = None
    if (run.adapter / "tokenizer_config.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(run.adapter))
        except Exception:  # noqa: BLE001 - a damaged copy: the base's own is the same tokenizer
            tokenizer = None
    tokenizer = tokenizer or fallback()
    if run.pad_id is not None and tokenizer.pad_token_id != run.pad_id:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(run.pad_id)
    tokenizer.padding_side = "right"
    return tokenizer


def write_merged(run: RewardRun, tmp: Path, dtype: str) -> None:
    saved = adapter_of(run)
    base, tokenizer = loaded_base(run)
    try:
        scorer = RewardScorer(base, LoraConfig(), seed=0, saved=saved)
    except LLMRLError as exc:
        raise failed(exc) from None
    merged = unquantized(scorer.peft.merge_and_unload())
    model = classifier(merged, saved.head, run.pad_id).to(DTYPES[dtype])
    model.config.dtype = dtype
    model.save_pretrained(tmp, safe_serialization=True)
    run_tokenizer(run, lambda: tokenizer).save_pretrained(tmp)


def adapter_of(run: RewardRun) -> Any:
    """RUN/adapter read and checked (models/scorer.py), its failure one sentence, exit 1."""
    try:
        return read_reward_adapter(run.adapter)
    except LLMRLError as exc:
        raise failed(exc) from None


def write_adapter(run: RewardRun, tmp: Path, dtype: str) -> None:
    """RUN/adapter's two peft files, every floating tensor cast to `dtype`, and the tokenizer."""
    adapter_of(run)
    weights = load_file(str(run.adapter / ADAPTER_FILES[1]))
    weights = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(weights, str(tmp / ADAPTER_FILES[1]), metadata={"format": "pt"})
    shutil.copyfile(run.adapter / ADAPTER_FILES[0], tmp / ADAPTER_FILES[0])

    def base_tokenizer() -> Any:
        source, _ = model_source(run.model, show_progress=False)
        return AutoTokenizer.from_pretrained(source, trust_remote_code=run.model.trust_remote_code)

    run_tokenizer(run, base_tokenizer).save_pretrained(tmp)


def export_reward(run_dir: Path, out: Path, *, dtype: str, adapter_only: bool, overwrite: bool,
                  push_to_hub: str | None, private: bool) -> Exported:
    """merge.export_run for a reward run folder (the module docstring)."""
    run = read_reward_run(run_dir)
    check_out(out, overwrite, run_dir)
    token = hub_token(push_to_hub) if push_to_hub else None  # before minutes of merging
    kind = "adapter" if adapter_only else "merged"

    def write(tmp: Path) -> None:
        (write_adapter if adapter_only else write_merged)(run, tmp, dtype)
        point_adapter(tmp, run.model.name)  # the adapter names its base by hub id or not at all
        reward_card(run.path, run.model, run.config, run.pad_id, kind, dtype, push_to_hub or out.name).save(tmp / "README.md")

    write_export(out, write)
    done = Exported(out, kind, dtype, f"adapter {run.adapter}", run.model.quantize, task="reward")
    if push_to_hub:
        url = push(out, push_to_hub, token or "", f"llmrl export of the reward run {run_dir.name} ({kind}, {dtype})",
                   private)
        done = replace(done, pushed=url)
    return done
