"""The LM head as the model's own forward applies it: some architectures transform the hidden state
before the head or the logits after it, and the training log-probs must see the same policy the
decoder samples from.

The chunked log-probs (models/logprobs.py) apply only the output embedding to the decoder's last
hidden state h, while decoding runs the model's forward. For a model whose forward does more than
z = W·h, π_old, π_θ and π_ref would then not be the sampler's policy, and with
`rollout.generation_logprobs` the first importance ratio would not be 1. What each causal LM of
transformers 5.25 does between `get_decoder()` and its logits, keyed on `config.model_type` (read from
each `…ForCausalLM.forward`; every other model type of `AutoModelForCausalLM` runs the plain head):

    gemma2, gemma3_text, gemma3n(_text),    final_logit_softcapping c:  z ↦ c · tanh(z / c)
      gemma4(_text), gemma4_unified(_text),
      vaultgemma, nanochat
    beam, inkling2_text, inkling2_loop_text final_logit_softcapping c:  z ↦ c · tanh(z / c) in float32
    recurrent_gemma                         logits_soft_cap c:          z ↦ c · tanh(z / c)
    xlstm                                   output_logit_soft_cap c:    z ↦ c · tanh(z / c) in float32
    cohere, cohere2, cohere2_moe,           logit_scale s:              z ↦ s · z
      cohere_compass_text
    granite, granite_swa, granitemoe,       logits_scaling s:           z ↦ z / s
      granitemoe_swa, granitemoehybrid,
      granitemoeshared
    hyperclovax                             logits_scaling s:           z ↦ s · z   (Granite divides)
    falcon_h1                               lm_head_multiplier m:       z ↦ m · z
    minicpm3                                logits_scaling s:           h ↦ h / s before the head
    inkling_text                            logits_mup_width_multiplier m, unpadded_vocab_size u:
                                                                        h ↦ h / m, then z ↦ z[..., :u]

(gemma3's Gemma3ForConditionalGeneration applies no softcapping, whatever its text config says.)

The table is what llmrl knows; what a model does is its forward. So `check_head` runs once at load
(models/load.py), on one row of a few tokens: the model's own last-position logits z against this
head applied to the decoder's last hidden state of the same forward, ẑ. Both come from the same h
through the same products; they differ only by where a transform rounds (beam's float32 softcap,
inkling's division before the head, GEMM blocking over a different number of positions), each a few
roundings of the compute dtype: |ẑ − z| ≤ ~2.5 ε·max|z| for a softcap (c·tanh(y/c) rounds y/c, tanh
and the product; x·sech²(x) ≤ 0.45). The check allows 4 ε·max|z| (ε: the hidden state's dtype:
1.2e-7 float32, 7.8e-3 bfloat16, also a 4-bit base's compute dtype) and refuses the model in one
sentence above it: a transform llmrl does not know (a 0.9 multiplier is 10 % of max|z|) cannot train
on another policy unnoticed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..errors import ConfigError

Transform = Callable[[Tensor], Tensor]
Transforms = tuple[Transform | None, Transform | None]
"""(before the head on h (…, H), after it on z (…, V)); None: nothing there."""


def _softcap(cap: float | None, upcast: bool = False) -> Transforms:
    if cap is None:
        return None, None
    if upcast:  # the forward softcaps `logits.float()`
        return None, lambda z: torch.tanh(z.float() / cap) * cap
    return None, lambda z: torch.tanh(z / cap) * cap


def _times(s: float | None) -> Transforms:
    return (None, None) if s is None else (None, lambda z: z * s)


def _inkling(text: Any) -> Transforms:
    m, u = text.logits_mup_width_multiplier, getattr(text, "unpadded_vocab_size", None)
    return (lambda h: h / m), (None if u is None else (lambda z: z[..., :u] if u < z.shape[-1] else z))


SOFTCAPPED = ("gemma2", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified",
              "gemma4_unified_text", "vaultgemma", "nanochat")
GRANITE = ("granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared")
COHERE = ("cohere", "cohere2", "cohere2_moe")

TRANSFORMS: dict[str, Callable[[Any], Transforms]] = {
    **dict.fromkeys(SOFTCAPPED, lambda t: _softcap(t.final_logit_softcapping)),
    **dict.fromkeys(("beam", "inkling2_text", "inkling2_loop_text"),
                    lambda t: _softcap(t.final_logit_softcapping, upcast=True)),
    "recurrent_gemma": lambda t: _softcap(t.logits_soft_cap),
    "xlstm": lambda t: _softcap(t.output_logit_soft_cap, upcast=True),
    **dict.fromkeys(COHERE, lambda t: _times(t.logit_scale)),
    "cohere_compass_text": lambda t: _times(t.logit_scale if t.logit_scale is not None else 1.0),
    **dict.fromkeys(GRANITE, lambda t: (None, lambda z: z / t.logits_scaling)),
    "hyperclovax": lambda t: _times(t.logits_scaling),
    "falcon_h1": lambda t: _times(t.lm_head_multiplier),
    "minicpm3": lambda t: ((lambda h: h / t.logits_scaling), None),
    "inkling_text": _inkling,
}
"""config.model_type → (its text config → the transforms its forward applies), as the module docstring lists."""


def logit_transform(config: Any) -> Transforms:
    """The (before, after) transforms `config`'s model applies around its head (module docstring);
    (None, None) for a model type whose forward runs the plain head."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rule = TRANSFORMS.get(getattr(config, "model_type", ""))
    return (None, None) if rule is None else rule(text)


class TransformedHead(nn.Module):
    """`before`, `head`, `after`: (…, H) → (…, V), as the model's forward computes its logits."""

    def __init__(self, head: nn.Module, before: Transform | None, after: Transform | None) -> None:
        super().__init__()
        self.head, self.before, self.after = head, before, after

    def forward(self, h: Tensor) -> Tensor:
        z = self.head(h if self.before is None else self.before(h))
        return z if self.after is None else self.after(z)


def model_head(model: nn.Module) -> nn.Module:
    """The output embedding of `model`, wrapped in its transforms where it has any."""
    head = model.get_output_embeddings()
    before, after = logit_transform(model.config)
    return head if before is None and after is None else TransformedHead(head, before, after)


def probe_row(tokenizer: Any, vocab: int) -> Tensor:
    """(1, T) ids of a short plain-text row for `check_head` (T ≤ 8; tokens of the tokenizer, so no
    image or other placeholder token a multimodal forward would expand)."""
    ids = [i for i in tokenizer("The head check: 12 + 30 = 42.", add_special_tokens=False)["input_ids"] if i < vocab]
    return torch.tensor([(ids or [0, 1, 2, 3])[:8]])


def head_gap(model: nn.Module, ids: Tensor) -> tuple[float, float, str | None]:
    """(max |ẑ − z|, the tolerance 4 ε·max|z|, why they cannot be compared or None) at the last
    position of `ids` (1, T): z the model's own logits, ẑ `model_head` on the hidden state its
    decoder returned inside that same forward (module docstring)."""
    seen: list[Any] = []
    hook = model.get_decoder().register_forward_hook(lambda _m, _a, out: seen.append(out))
    ids = ids.to(model.get_input_embeddings().weight.device)
    try:
        with torch.no_grad():
            z = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0, -1]
    finally:
        hook.remove()
    out = seen[0] if len(seen) == 1 else None
    h = getattr(out, "last_hidden_state", out[0] if isinstance(out, tuple) else None)
    if not isinstance(h, Tensor):
        return 0.0, 0.0, "its forward does not run its decoder (get_decoder()) once to the last hidden state llmrl's log-probs start from"
    with torch.no_grad():
        ours = model_head(model)(h)[0, -1]
    if ours.shape != z.shape:
        return 0.0, 0.0, f"its logits have {z.shape[-1]} entries and its LM head's {ours.shape[-1]}"
    z = z.float()
    return float((ours.float() - z).abs().max()), 4 * torch.finfo(h.dtype).eps * float(z.abs().max()), None


def check_head(name: str, model: nn.Module, ids: Tensor) -> None:
    """Refuse `model` where llmrl's head does not reproduce its own logits on the row `ids` (1, T)
    (`head_gap`): training would update another policy than the one the decoder samples."""
    kind = getattr(model.config, "model_type", type(model).__name__)
    try:
        gap, tol, why = head_gap(model, ids)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a forward llmrl cannot run: said in one sentence
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"Model '{name}' ({kind}) fails a forward of one {ids.shape[-1]}-token row, so llmrl "
                          f"cannot train it: {type(exc).__name__}: {first}") from None
    if why is not None:
        raise ConfigError(f"Model '{name}' ({kind}) cannot be trained by llmrl: {why}.")
    if not gap <= tol:  # NaN too
        raise ConfigError(f"Model '{name}' ({kind}) computes its logits in a way llmrl does not reproduce: on one "
                          f"{ids.shape[-1]}-token row its own last-position logits differ from llmrl's LM head by "
                          f"up to {gap:.3g} (tolerance {tol:.2g}), so training would update another policy than "
                          f"the one it samples.")
