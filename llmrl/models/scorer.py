"""A reward model on the run's base: a LoRA adapter `reward` and a score head, r(x, y) ∈ ℝ.

    r(x, y) = w · h_ℓ        h = decoder(ids)  (N, L, H),  ℓ = the rightmost token that is not padding,
                             w ∈ ℝ^{1×H} the score head (no bias)

ℓ is transformers' rule for every `…ForSequenceClassification` (`(arange(L) · (ids ≠ pad)).argmax(-1)`), so
a merged export scores as llmrl does (export/reward.py). The same code serves a reward run, where the
adapter is the one trainable thing (`RewardScorer`), and an RL run, where it is the stack's fourth role
(`PolicyStack.add_reward`): scored under no_grad with the adapters switched, never updated.

On disk the adapter is peft's own SEQ_CLS format (`save_reward_adapter`, `read_reward_adapter`): plain peft
loads it onto `AutoModelForSequenceClassification`, and a LoRA reward model trained by TRL's `RewardTrainer`
reads back the same way.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..config.schema import LoraConfig
from ..errors import ConfigError
from .adapters import lora_settings, of_adapter
from .buckets import model_call_positions
from .logprobs import at_least_float32
from .prefix import PromptGroups, common_prefix, shared_prefix_tail
from .sequences import Sequences

ADAPTER = "reward"
HEAD_KEY = "base_model.model.score.weight"  # peft's name for a SEQ_CLS model's `score` (modules_to_save)
SEQ_CLS_SAVED = ("score", "classifier", "pre_classifier")  # what peft adds to a SEQ_CLS adapter's modules_to_save


def last_token(ids: Tensor, pad_id: int | None) -> Tensor:
    """(N,) the index of each row's rightmost token that is not `pad_id` (transformers' rule; L−1 without
    a pad token, 0 for a row of padding only). ids: (N, L)."""
    if pad_id is None:
        return torch.full((ids.shape[0],), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
    positions = torch.arange(ids.shape[1], device=ids.device)
    return (positions * (ids != pad_id)).argmax(-1)


def score_head(hidden: int, dtype: torch.dtype, device: torch.device, std: float, seed: int) -> nn.Linear:
    """w: Linear(H → 1, no bias), at least float32 (a master copy on a half-precision base), drawn
    N(0, std²) as transformers initialises `score` (std: the config's initializer_range)."""
    head = nn.Linear(hidden, 1, bias=False, dtype=at_least_float32(dtype), device=device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(seed)) * std)
    return head


def scores(decoder: nn.Module, head: nn.Linear, ids: Tensor, attention: Tensor, pad_id: int | None) -> Tensor:
    """r for each row of a right-padded batch: (N, L) ids and mask → (N,) float32."""
    h = decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    last = h[torch.arange(h.shape[0], device=h.device), last_token(ids, pad_id)]
    return head(last.to(head.weight.dtype)).squeeze(-1).float()


def tokenized(tokenizer: Any, texts: Sequence[str], device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-padded ids and mask (N, L) of `texts`, never truncated (the caller checks the lengths)."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def reward_settings(cfg: LoraConfig, model: nn.Module) -> PeftLoraConfig:
    """The reward adapter's peft settings from llmrl's `lora` section (models/stack.lora_settings' rule)."""
    return lora_settings(cfg, model)


@dataclass(frozen=True)
class SavedReward:
    """A reward adapter read from disk: its peft settings (as a causal-LM adapter, to be added to a base's
    PeftModel), its LoRA (and modules_to_save) tensors by peft's saved names, and the score head (1, H)."""

    settings: PeftLoraConfig
    weights: dict[str, Tensor]
    head: Tensor
    base: str | None  # adapter_config's base_model_name_or_path
    folder: Path | None = None  # where it was read from, named by the errors of a base it does not fit


def read_reward_adapter(folder: Path) -> SavedReward:
    """`folder`'s adapter_config.json (task_type SEQ_CLS) and adapter_model.safetensors; a ConfigError in one
    sentence for anything else."""
    cfg_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        raise ConfigError(f"Reward adapter '{folder}' has no adapter_config.json and adapter_model.safetensors.")
    try:
        raw = json.loads(cfg_path.read_text())
        weights = load_file(str(weights_path))
    except Exception as exc:  # json, safetensors: a damaged file
        raise ConfigError(f"Reward adapter '{folder}' cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}.") from None
    if not isinstance(raw, dict) or raw.get("peft_type") != "LORA" or raw.get("task_type") != "SEQ_CLS":
        kind = (raw.get("peft_type"), raw.get("task_type")) if isinstance(raw, dict) else (None, None)
        raise ConfigError(f"Reward adapter '{folder}' is not a LoRA sequence classifier (peft_type "
                          f"{kind[0]}, task_type {kind[1]}).")
    head = weights.pop(HEAD_KEY, None)
    if head is None or head.ndim != 2 or head.shape[0] != 1:
        raise ConfigError(f"Reward adapter '{folder}' has no score head of one label ('{HEAD_KEY}').")
    saved = [m for m in raw.get("modules_to_save") or [] if m not in SEQ_CLS_SAVED]
    try:
        _check_settings(raw)
        settings = PeftLoraConfig(r=raw["r"], lora_alpha=raw["lora_alpha"], lora_dropout=0.0,
                                  target_modules=raw["target_modules"], modules_to_save=saved or None,
                                  bias=raw.get("bias", "none"), use_rslora=raw.get("use_rslora", False),
                                  task_type="CAUSAL_LM")
    except (KeyError, TypeError, ValueError) as exc:  # a hand-edited or foreign adapter_config.json
        why = f"it lacks '{exc.args[0]}'" if isinstance(exc, KeyError) else str(exc).strip().splitlines()[0]
        raise ConfigError(f"Reward adapter '{folder}' has an adapter_config.json peft cannot use: {why}.") from None
    base = raw.get("base_model_name_or_path")
    return SavedReward(settings, weights, head, base if isinstance(base, str) and base else None, folder)


def _check_settings(raw: dict[str, Any]) -> None:
    """The LoRA settings a reward adapter needs, of the types peft takes: r ≥ 1 an integer, lora_alpha a number,
    target_modules a name or a list of names (KeyError / TypeError naming the bad one)."""
    r, alpha, targets = raw["r"], raw["lora_alpha"], raw["target_modules"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise TypeError(f"'r' is {r!r}, not an integer ≥ 1")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"'lora_alpha' is {alpha!r}, not a number")
    if not (isinstance(targets, str) or (isinstance(targets, list) and targets
                                          and all(isinstance(t, str) for t in targets))):
        raise TypeError(f"'target_modules' is {targets!r}, not a module name or a list of them")


def _misfit(saved: SavedReward, why: str) -> ConfigError:
    """The one sentence for a reward adapter whose tensors or modules have no place in this base."""
    where = f"Reward adapter '{saved.folder}'" if saved.folder else "The reward adapter"
    return ConfigError(f"{where} does not fit this base ({why}); it was trained on another model: score it on "
                       "the base it was trained on.")


def check_fit(saved: SavedReward, base: nn.Module) -> None:
    """Refuse, before peft touches `base`, a reward adapter made for another model: a score head whose width is
    not the base's hidden size H (it holds (1, H)), or target_modules that name no module of the base (peft's
    rule: a name equal to a module's last parts, or a regular expression over its full name)."""
    hidden = base.config.get_text_config().hidden_size
    if saved.head.shape[1] != hidden:
        raise _misfit(saved, f"its score head is {tuple(saved.head.shape)}, the base's hidden size {hidden}")
    targets, names = saved.settings.target_modules, [n for n, _ in base.named_modules() if n]
    if isinstance(targets, str):
        hit = any(re.fullmatch(targets, n) for n in names)
    else:
        hit = any(n == t or n.endswith(f".{t}") for n in names for t in targets)
    if not hit:
        shown = targets if isinstance(targets, str) else sorted(targets)
        raise _misfit(saved, f"its target_modules {shown} match no layer of it")


def add_reward_adapter(peft: PeftModel, saved: SavedReward) -> None:
    """Add `saved` as adapter `reward` to a causal LM's PeftModel (the RL stack's) and load its tensors."""
    try:
        peft.add_adapter(ADAPTER, saved.settings)
    except ValueError as exc:  # peft's NoMatchingPeftModuleError: target_modules name no layer of this base
        raise _misfit(saved, f"its target_modules {saved.settings.target_modules} match no layer of it") from None
    load_reward_weights(peft, saved)


def load_reward_weights(peft: PeftModel, saved: SavedReward, adapter: str = ADAPTER) -> None:
    """Load `saved`'s tensors into `adapter` of `peft`; every tensor of the file must land (a name that
    matches no module means another architecture: refused)."""
    try:
        result = set_peft_model_state_dict(peft, dict(saved.weights), adapter_name=adapter)
    except RuntimeError as exc:  # torch's load_state_dict: "size mismatch for NAME: copying a param with shape …"
        lines = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        raise _misfit(saved, lines[0].rstrip(".") if lines else str(exc).strip().splitlines()[0]) from None
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if adapter in k or "lora_" in k]
    missing = [k for k in getattr(result, "missing_keys", []) if f".{adapter}." in k or k.endswith(f".{adapter}")]
    if unexpected or missing:
        raise _misfit(saved, f"its tensor '{(unexpected or missing)[0]}' has no place in it")


def save_reward_adapter(folder: Path, peft: PeftModel, head: nn.Linear, base: str | None) -> None:
    """Write adapter `reward` of `peft` and `head` in peft's SEQ_CLS format (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(peft, adapter_name=ADAPTER)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    state[HEAD_KEY] = head.weight.detach().cpu().contiguous()
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    settings = peft.peft_config[ADAPTER].to_dict()
    settings.update(task_type="SEQ_CLS", base_model_name_or_path=base, inference_mode=True,
                    modules_to_save=sorted(set(settings.get("modules_to_save") or []) | {"score"}))
    settings["target_modules"] = sorted(settings["target_modules"]) if isinstance(settings["target_modules"], (set, list)) else settings["target_modules"]
    (folder / "adapter_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True, default=str))


@dataclass(frozen=True)
class PairBatch:
    """Texts laid out to share prompts: `sequences` (N, S+T), each row's shared prefix left-padded to S and its
    own rest right-padded to T; `groups` the rows that share a prefix (models/prefix.py); `ends` (N,) long, the
    column of each row's last token within the T response columns."""

    sequences: Sequences
    groups: PromptGroups
    ends: Tensor


class RewardScorer(nn.Module):
    """A reward run's model: the frozen base with adapter `reward` (trainable) and the score head.
    `trainable_roles`/`parameters_of` as PolicyStack's, so run/checkpoint.py saves and restores it."""

    def __init__(self, base: nn.Module, lora: LoraConfig, seed: int, saved: SavedReward | None = None) -> None:
        super().__init__()
        for p in base.parameters():
            p.requires_grad_(False)
        cfg = base.config.get_text_config()
        settings = reward_settings(lora, base) if saved is None else saved.settings
        if saved is not None:
            check_fit(saved, base)
        try:
            self.peft = get_peft_model(base, settings, adapter_name=ADAPTER)
        except ValueError as exc:  # e.g. a target that is not a layer type LoRA supports (a norm): as stack.py says it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"LoRA cannot adapt the model with lora.target_modules={settings.target_modules}: "
                              f"{first.rstrip('.')}.") from None
        self.head = score_head(cfg.hidden_size, base.dtype, base.device, getattr(cfg, "initializer_range", 0.02), seed)
        if saved is not None:  # a reward run's adapter scored, or a training resumed from its files
            load_reward_weights(self.peft, saved)
            with torch.no_grad():
                self.head.weight.copy_(saved.head)
        self._dropouts = [m for m in self.peft.modules() if isinstance(m, nn.Dropout)]
        self.call_cost = model_call_positions(self.peft.base_model.model)
        self.eval()

    @contextmanager
    def dropout_active(self) -> Iterator[None]:
        """LoRA dropout on in the body (the update's forwards); everything else runs in eval mode."""
        for d in self._dropouts:
            d.train()
        try:
            yield
        finally:
            for d in self._dropouts:
                d.eval()

    def trainable_roles(self) -> list[str]:
        return [ADAPTER]

    def parameters_of(self, role: str) -> list[nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if of_adapter(n, ADAPTER)] + list(self.head.parameters())

    @property
    def dropouts(self) -> list[nn.Dropout]:
        return self._dropouts

    def forward(self, ids: Tensor, attention: Tensor, pad_id: int | None) -> Tensor:
        """(N, L) → (N,) scores through the adapter."""
        return scores(self.peft.base_model.model.get_decoder(), self.head, ids, attention, pad_id)

    def shared(self, batch: PairBatch) -> Tensor:
        """(N,) scores of a `PairBatch` through the adapter: r = w · h at each row's last response position, its
        shared prompt computed once per group and the opening all groups start with once where that saves more
        positions than a forward call costs (models/prefix.py)."""
        seq, groups = batch.sequences, batch.groups
        p = seq.prompt_len
        prompt_ids, prompt_mask = seq.ids[groups.first, :p], seq.attention[groups.first, :p]
        k = common_prefix(prompt_ids, prompt_mask)
        k = k if k * (prompt_ids.shape[0] - 1) > self.call_cost else 0
        tail = shared_prefix_tail(self.peft.base_model.model.get_decoder(), seq.ids, seq.attention, seq.positions,
                                  p, groups, k)
        last = tail[torch.arange(tail.shape[0], device=tail.device), batch.ends]
        return self.head(last.to(self.head.weight.dtype)).squeeze(-1).float()


def reward_role(peft: PeftModel, saved: SavedReward) -> nn.Linear:
    """The RL stack's fourth role: `saved` added to the stack's PeftModel as adapter `reward` (frozen), and its
    score head, at least float32 and frozen, returned."""
    check_fit(saved, peft.base_model.model)
    add_reward_adapter(peft, saved)
    for name, p in peft.named_parameters():
        if ADAPTER in name.split("."):
            p.requires_grad_(False)
    base = peft.base_model.model
    head = score_head(saved.head.shape[1], base.dtype, base.device, 0.0, 0)
    with torch.no_grad():
        head.weight.copy_(saved.head)
    return head.requires_grad_(False)


def start_critic(peft: PeftModel, value_head: nn.Linear, saved: SavedReward) -> None:
    """The critic's adapter (made with `saved`'s settings) and value head start as the reward model's:
    V(s_t) = w·h_t with the reward adapter's h, bias 0 (InstructGPT, DeepSpeed-Chat)."""
    load_reward_weights(peft, saved, adapter="critic")
    with torch.no_grad():
        value_head.weight.copy_(saved.head)
        value_head.bias.zero_()


@torch.no_grad()
def stack_scores(stack: Any, tokenizer: Any, texts: Sequence[str], batch_size: int) -> list[float]:
    """r(x, y) of each text through the stack's `reward` role (no_grad, adapters switched), `batch_size`
    texts per forward, right-padded."""
    with stack.use("reward"):
        return text_scores(stack.lm.get_decoder(), stack.reward_head, tokenizer, texts, batch_size)


@torch.no_grad()
def text_scores(decoder: nn.Module, head: nn.Linear, tokenizer: Any, texts: Sequence[str], batch_size: int) -> list[float]:
    """r of each text (`scores`), `batch_size` texts per no-grad forward, right-padded, on the head's device."""
    out: list[float] = []
    for start in range(0, len(texts), batch_size):
        ids, mask = tokenized(tokenizer, texts[start:start + batch_size], head.weight.device)
        out += scores(decoder, head, ids, mask, tokenizer.pad_token_id).tolist()
    return out
