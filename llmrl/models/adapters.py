"""peft's settings of an llmrl adapter, and which adapter a peft parameter belongs to: shared by the policy
stack (stack.py: actor, critic) and the reward model (scorer.py)."""

from __future__ import annotations

from peft import LoraConfig as PeftLoraConfig
from torch import nn

from ..config.schema import LoraConfig


def lora_settings(cfg: LoraConfig, model: nn.Module) -> PeftLoraConfig:
    """peft LoraConfig from llmrl's; 'all-linear' (every linear layer but the LM head) by default;
    `lora.modules_to_save` by the full names of `model`'s modules (`saved_modules`)."""
    return PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules or "all-linear",
        modules_to_save=saved_modules(model, cfg.modules_to_save),
        bias="none",
        task_type="CAUSAL_LM",
    )


def saved_modules(model: nn.Module, entries: list[str] | None) -> list[str] | None:
    """The full names of `model`'s modules whose name ends with an entry of `lora.modules_to_save`
    ('norm' → every `…input_layernorm`, `…post_attention_layernorm` and `model.norm`): llmrl's rule, which
    peft ≤ 0.21 applied itself; peft 0.22 matches whole dotted components only ('norm' → `model.norm`
    alone), so the names are resolved here and both read them alike. Wrapped modules' own parts
    (`….modules_to_save.actor`, `….original_module`) end otherwise and are never named."""
    if not entries:
        return entries
    return [n for n, _ in model.named_modules() if n and any(n.endswith(e) for e in entries)]


def of_adapter(name: str, adapter: str) -> bool:
    """Whether the peft parameter `name` belongs to `adapter`: peft names it as one component,
    `…q_proj.lora_A.actor.weight`, `…norm.modules_to_save.actor.weight`, and for an embedding's LoRA
    `…embed_tokens.lora_embedding_A.actor`, with nothing after it (so a test for '.actor.' misses it)."""
    return adapter in name.split(".")
