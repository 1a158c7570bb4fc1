"""A critic on the top k decoder layers only (`lora.critic_layers`): its forward from layer L−k.

When the critic's adapter sits on layers L−k … L−1 alone, the critic's hidden state entering layer
L−k is the frozen base's (no adapter below it changes anything), so

    h_{L−k}  = base forward of layers 0 … L−k−1       (no grad; or kept from the reference forward)
    V(s_t)   = value_head(norm(layers_{L−k … L−1}(h_{L−k})))

runs k of the L layers with a graph, and the backward stops at h_{L−k}. The decoder is still called
as a whole, so whatever it does before and after its layers (embeddings, GPT-2's position
embeddings, Gemma's scaling, the causal mask, rotary embeddings, the final norm) happens as in a full
forward; the layers below L−k are only short-circuited to return h_{L−k} for the duration of the
call. No per-architecture code: every decoder that keeps its layers in one `nn.ModuleList` of
`num_hidden_layers` blocks called in order with the hidden state first works (Llama, Qwen2, Mistral,
SmolLM, GPT-2, …).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from torch import Tensor, nn

from ..errors import ConfigError


def _layer_count(model: nn.Module) -> int:
    return int(model.config.get_text_config().num_hidden_layers)


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The (dotted name, module list) of `model`'s decoder layers: the one `nn.ModuleList` holding
    exactly `num_hidden_layers` blocks (`model.layers` for Llama/Qwen2, `transformer.h` for GPT-2)."""
    count = _layer_count(model)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count]
    if len(found) != 1:
        raise ConfigError(f"'lora.critic_layers' needs a model whose {count} decoder layers form one list; "
                          f"{type(model).__name__} has {len(found)} such lists.")
    return found[0]


def _hidden_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The hidden state a decoder layer is called with: its first positional argument or `hidden_states`."""
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def capture_layer_input(decoder: nn.Module, start: int, on: bool = True) -> Iterator[list[Tensor]]:
    """Append the hidden state entering decoder layer `start`, detached, (rows, positions, H), to the
    yielded list at every call of the decoder in the body (two with shared prompts: the distinct
    prompts, then the responses). `on=False`: no hook, the list stays empty."""
    parts: list[Tensor] = []
    if not on:
        yield parts
        return
    layer = decoder_layers(decoder)[1][start]
    hook = layer.register_forward_pre_hook(lambda _m, a, k: parts.append(_hidden_arg(a, k).detach()), with_kwargs=True)
    try:
        yield parts
    finally:
        hook.remove()


class _Reached(Exception):
    """Raised by the hook of `layer_input` to stop a forward at the layer it waits for."""

    def __init__(self, hidden: Tensor) -> None:
        super().__init__("layer reached")
        self.hidden = hidden


def layer_input(decoder: nn.Module, start: int, run: Callable[[], Any]) -> Tensor:
    """The hidden state entering decoder layer `start` in the forward `run()` calls, which is stopped
    there: layers `start` … L−1 and the final norm never run."""
    def stop(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _Reached(_hidden_arg(args, kwargs).detach())

    hook = decoder_layers(decoder)[1][start].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        run()
    except _Reached as reached:
        return reached.hidden
    finally:
        hook.remove()
    raise RuntimeError(f"the forward never reached decoder layer {start}")


@contextmanager
def from_layer(decoder: nn.Module, start: int, hidden: Tensor) -> Iterator[None]:
    """Calls of `decoder` in the body skip layers 0 … start−1: each returns `hidden` (N, S, H), the
    state entering layer `start`, which the decoder then passes on through layers start … L−1 and
    its final norm. The decoder must be called with S positions (the same ids, mask and positions
    as the forward `hidden` came from)."""
    lower = list(decoder_layers(decoder)[1])[:start]
    saved = [layer.__dict__.get("forward") for layer in lower]
    for layer in lower:
        layer.forward = lambda *_a, **_k: hidden
    try:
        yield
    finally:
        for layer, old in zip(lower, saved):
            del layer.forward
            if old is not None:
                layer.forward = old
