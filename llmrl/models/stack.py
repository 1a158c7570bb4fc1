"""Actor, critic and reference on one frozen base model.

| role      | what it is                                   | context            |
|-----------|----------------------------------------------|--------------------|
| actor     | base + LoRA adapter `actor`                  | `stack.use("actor")` |
| critic    | base + LoRA adapter `critic` + value head    | `stack.use("critic")` |
| reference | the base itself, adapters disabled           | `stack.use("reference")` |
| reward    | base + LoRA adapter `reward` + score head, never trained (scorer.py) | `stack.use("reward")` |

peft injects both adapters into the same base modules, so exactly one copy of the base weights
exists. `set_adapter` also decides which adapter is trainable, so the actor and the critic are
updated in separate passes, each inside its own context.

Modes: every module of the stack stays in eval mode, so generation, every no-grad forward,
evaluation and export are deterministic. `lora.dropout` is a regulariser of the update only: its
gradient forwards run inside `stack.dropout_active()`, which turns exactly the LoRA dropout modules to
train mode and back.

Precision: in a float16/bfloat16 run the trainable full-module copies (`lora.modules_to_save`,
e.g. norms) are float32 master weights, like peft's LoRA weights (masters.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from torch import Tensor, nn
from transformers import PreTrainedModel

from ..config.schema import LoraConfig
from ..errors import ConfigError
from .buckets import bucketed, model_call_positions
from .sequences import Sequences, layout  # noqa: F401  (re-exported: the layout's home was here)
from .checkpointing import checkpoint_layers
from .decoding import wide
from .logit_head import model_head
from .logprobs import CHUNK_MIB, at_least_float32, chunk_positions, tempered, token_stats
from .masters import float32_masters, release
from .adapters import lora_settings, of_adapter, saved_modules  # noqa: F401  (their home was here)
from .scorer import SavedReward, check_fit, reward_role, start_critic
from .prefix import PromptGroups, common_prefix, distinct_prompts, shared_prefix_hidden
from .top_layers import capture_layer_input, decoder_layers, from_layer, layer_input

ROLES = ("actor", "critic", "reference", "reward")


def check_lora_targets(base: nn.Module, lora: LoraConfig) -> None:
    """Refuse `lora.target_modules` that name no linear layer of `base` and `lora.modules_to_save`
    entries that match no module (peft matches a module whose full name ends with the entry)."""
    names = [name for name, _ in base.named_modules() if name]
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in base.named_modules() if isinstance(m, nn.Linear)})
    if lora.target_modules is not None:
        wanted = set(lora.target_modules)
        if not any(n in wanted or n.rsplit(".", 1)[-1] in wanted for n in names):
            raise ConfigError(f"'lora.target_modules' {lora.target_modules} matches no linear layer of the model; "
                              f"its linear layers: {', '.join(linear)}.")
    for entry in lora.modules_to_save or []:
        if not any(n.endswith(entry) for n in names):
            leaves = sorted({leaf for n in names if not (leaf := n.rsplit(".", 1)[-1]).isdigit()})
            raise ConfigError(f"'lora.modules_to_save' entry '{entry}' matches no module of the model; "
                              f"its modules: {', '.join(leaves)}.")


def tied_embeddings(model: nn.Module) -> list[str]:
    """The module names of the input embedding and the LM head when they share one weight
    (`tie_word_embeddings`, e.g. SmolLM2, Qwen2.5, the built-in tiny model); [] when untied."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    if out is None or getattr(out, "weight", None) is not getattr(inp, "weight", None):
        return []
    return [n for n, m in model.named_modules() if m is inp or m is out]


def _check_tied_lora(model: nn.Module, tied: list[str]) -> None:
    """Refuse LoRA on a tied embedding or head: peft adds B·A to one of them, but a merge (`llmrl export`,
    the vllm engine's sync) writes W + s·B·A into the one shared weight, which changes the other too."""
    for name in tied:
        if isinstance(model.get_submodule(name), LoraLayer):
            leaf = name.rsplit(".", 1)[-1]
            raise ConfigError(f"'lora.target_modules' puts LoRA on '{leaf}', but this model ties its LM head to its input "
                              f"embedding (one weight), so a merge would change both; leave '{leaf}' out, or train an "
                              f"untied copy with lora.modules_to_save=[{leaf}].")


class PolicyStack(nn.Module):
    """The frozen base, the `actor` (and optionally `critic`) adapters and the value head.

    `hidden` runs the decoder only; the LM head is applied to response positions alone, so the
    prompt's P positions never pay for a (P × vocab) projection. With `share_prompts`, a batch that
    repeats its prompts (G samples each) runs each distinct prompt once (models/prefix.py).
    """

    def __init__(self, base: PreTrainedModel, lora: LoraConfig, with_critic: bool, share_prompts: bool = True,
                 logits_chunk_mib: float = CHUNK_MIB, activation_checkpointing: bool = False,
                 length_buckets: bool = False, reward: SavedReward | None = None,
                 critic_from: SavedReward | None = None) -> None:
        super().__init__()
        self.share_prompts = share_prompts
        self.length_buckets = length_buckets  # rows run in groups of like length (buckets.py)
        self.call_cost = model_call_positions(base)  # a forward call's cost in positions (buckets.py)
        self.checkpointing = activation_checkpointing  # gradient forwards recompute each layer (checkpointing.py)
        head = base.get_output_embeddings()
        vocab = head.weight.shape[0] if head is not None else base.config.get_text_config().vocab_size
        self.logits_chunk = chunk_positions(logits_chunk_mib, vocab)  # positions per chunk (models/logprobs.py)
        for p in base.parameters():
            p.requires_grad_(False)
        check_lora_targets(base, lora)
        for saved in {id(r): r for r in (reward, critic_from) if r is not None}.values():
            check_fit(saved, base)  # a reward adapter of another model: one sentence before peft wraps the base
        self.tied = tied_embeddings(base)  # before peft wraps them
        try:
            self.peft: PeftModel = get_peft_model(base, lora_settings(lora, base), adapter_name="actor")
        except ValueError as exc:  # e.g. a target that is not a layer type LoRA supports (a norm)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"LoRA cannot adapt the model with lora.target_modules={lora.target_modules}: "
                              f"{first.rstrip('.')}.") from None
        _check_tied_lora(self.peft.base_model.model, self.tied)
        self.has_critic = with_critic
        self.value_head: nn.Linear | None = None
        self.critic_start = 0  # the critic's first adapted decoder layer L−k (lora.critic_layers)
        self.critic_shortcut = False  # its forward starts from the base's hidden state there
        self._keep: list[Tensor] | None = None  # see `keeping_base`
        self._merged = False  # the actor's LoRA is merged into the base weights now (models/merged.py)
        if with_critic:
            self.peft.add_adapter("critic", self._critic_settings(lora, critic_from))
            hidden = base.config.get_text_config().hidden_size
            self.value_head = nn.Linear(hidden, 1, dtype=at_least_float32(base.dtype), device=base.device)
            nn.init.zeros_(self.value_head.bias)
            nn.init.zeros_(self.value_head.weight)  # V ≡ 0 at the start: no random baseline noise
            if critic_from is not None:  # InstructGPT's critic: the reward model's adapter and head (scorer.py)
                start_critic(self.peft, self.value_head, critic_from)
        self.reward_head = reward_role(self.peft, reward) if reward is not None else None
        self.peft.set_adapter("actor")
        self._role = "actor"
        if activation_checkpointing:
            checkpoint_layers(decoder_layers(self.lm)[1])
        self._masters = float32_masters(self.peft)
        # peft creates its LoRA dropout modules in train mode: switch them off everywhere but the update
        self._dropouts = [d for layer in self.peft.modules() if isinstance(layer, LoraLayer)
                          for d in layer.lora_dropout.values() if isinstance(d, nn.Dropout)]
        self.eval()

    def _critic_settings(self, lora: LoraConfig, critic_from: SavedReward | None = None) -> PeftLoraConfig:
        """The critic's peft settings: the actor's, restricted to the top k decoder layers when
        `lora.critic_layers` = k (the modules the actor adapts inside layers L−k … L−1, by full name); the
        reward adapter's (rank, targets) with `lora.dropout` when it starts from one."""
        if critic_from is not None:
            return replace(critic_from.settings, lora_dropout=lora.dropout)
        settings = lora_settings(lora, self.lm)
        k = lora.critic_layers
        if k is None:
            return settings
        prefix, layers = decoder_layers(self.lm)
        if k > len(layers):
            raise ConfigError(f"'lora.critic_layers' ({k}) exceeds the model's {len(layers)} decoder layers.")
        self.critic_start = len(layers) - k
        self.critic_shortcut = lora.critic_shortcut and self.critic_start > 0
        top = tuple(f"{prefix}.{i}." for i in range(self.critic_start, len(layers)))
        settings.target_modules = sorted(n for n in self.peft.targeted_module_names if n.startswith(top))
        if lora.modules_to_save:
            settings.modules_to_save = self._critic_saved(prefix, top)
        return settings

    def _critic_saved(self, prefix: str, top: tuple[str, ...]) -> list[str]:
        """The `modules_to_save` the top-k critic trains, by full name: those inside its layers and
        those outside the layer list (e.g. the final norm); those in lower layers stay frozen for it.
        A trained embedding would change every layer's input: refused."""
        wrapped = {n: m for n, m in self.lm.named_modules() if isinstance(m, ModulesToSaveWrapper)}
        outside = [n for n in wrapped if not n.startswith(prefix + ".")]
        if any(isinstance(wrapped[n].original_module, nn.Embedding) for n in outside):
            raise ConfigError("'lora.critic_layers' cannot be combined with an embedding in 'lora.modules_to_save' "
                              "(it would change the hidden states below the critic's layers).")
        return sorted(outside + [n for n in wrapped if n.startswith(top)])

    # ---- roles -------------------------------------------------------------------------------
    @property
    def lm(self) -> PreTrainedModel:
        """The causal LM with the LoRA layers injected (what generation calls)."""
        return self.peft.base_model.model

    @property
    def role(self) -> str:
        """The role the stack runs as now: 'actor', 'critic' or 'reference'."""
        return self._role

    @contextmanager
    def use(self, role: str) -> Iterator[None]:
        """Run the body as `role`: 'actor', 'critic', 'reference' (adapters disabled) or 'reward'."""
        if role not in ROLES or (role == "critic" and not self.has_critic) or (role == "reward" and self.reward_head is None):
            raise ValueError(f"unknown or unavailable role '{role}'")
        previous = self._role
        if role == "reference":
            self._role = role
            try:
                with self.peft.disable_adapter():
                    yield
            finally:
                self._role = previous
            return
        self._set_adapter(role)
        self._role = role
        try:
            yield
        finally:
            self._set_adapter(previous if previous != "reference" else "actor")
            self._role = previous

    def _set_adapter(self, role: str) -> None:
        """peft's set_adapter, every LoRA dropout module kept in its mode: peft 0.22 also sets the activated
        adapter's submodules to the tuner layer's mode (eval here), which inside `dropout_active` would
        silently turn the role's dropout off."""
        modes = [d.training for d in self._dropouts]
        self.peft.set_adapter(role)
        for d, mode in zip(self._dropouts, modes):
            d.train(mode)

    @contextmanager
    def dropout_active(self) -> Iterator[None]:
        """LoRA dropout active in the body: the update's gradient forwards (actor and critic). Outside
        it every LoRA dropout module is in eval mode (the identity). With `lora.dropout` = 0 peft
        builds no dropout module, so this changes nothing and draws no random number."""
        before = [d.training for d in self._dropouts]
        for d in self._dropouts:
            d.train()
        try:
            yield
        finally:
            for d, mode in zip(self._dropouts, before):
                d.train(mode)

    def _dropout_on(self) -> bool:
        """Whether LoRA dropout draws masks now (`dropout_active` with lora.dropout > 0)."""
        return any(d.training and d.p > 0 for d in self._dropouts)

    def release_float32_masters(self) -> None:
        """Undo `float32_masters` (before a merge into the base's dtype): hooks removed, every
        trainable copy cast back to the dtype it had. A no-op for a float32 base."""
        release(self._masters)
        self._masters = []

    def trainable_roles(self) -> list[str]:
        return ["actor", "critic"] if self.has_critic else ["actor"]

    def parameters_of(self, role: str) -> list[nn.Parameter]:
        """Trainable parameters of 'actor' (its adapter) or 'critic' (its adapter + value head)."""
        params = [p for n, p in self.peft.named_parameters() if of_adapter(n, role)]
        if role == "critic" and self.value_head is not None:
            params += list(self.value_head.parameters())
        return params

    # ---- forwards -----------------------------------------------------------------------------
    @contextmanager
    def keeping_base(self, keep: list[Tensor] | None) -> Iterator[None]:
        """Forwards in the body (`hidden`) append the hidden state entering decoder layer L−k,
        detached, (N, P+T, H), to `keep` (a top-k critic's shortcut, `lora.critic_layers`; run it
        under `use('reference')`); None: nothing is kept."""
        self._keep = keep
        try:
            yield
        finally:
            self._keep = None

    def hidden(self, seq: Sequences) -> Tensor:
        """Last hidden states at the positions that predict response tokens: (N, T, H)."""
        keep = self._keep
        p = seq.prompt_len
        # a checkpointed gradient forward cannot write into the shared prompts' KV cache (checkpointing.py), and
        # with LoRA dropout drawing masks a prompt run once would give all its rows one mask where each draws its own
        shared = self.share_prompts and not (torch.is_grad_enabled() and (self.checkpointing or self._dropout_on()))
        groups = distinct_prompts(seq.ids[:, :p], seq.attention[:, :p]) if shared else None
        decoder = self.lm.get_decoder()
        with capture_layer_input(decoder, self.critic_start, keep is not None) as parts:
            if groups is not None:  # a kept layer input is put together from exactly two calls
                opening = 0 if keep is not None else self.opening(seq.ids[:, :p], seq.attention[:, :p], groups)
                h = shared_prefix_hidden(decoder, seq.ids, seq.attention, seq.positions, p, groups, opening)
            elif keep is not None:
                h = self._plain(seq)[:, p - 1 : -1]
            else:
                h = bucketed(lambda part: self._responses(part, shared), seq, self.call_cost) if self.length_buckets else None
                h = self._responses(seq, shared) if h is None else h
            h = h.contiguous() if wide(h) else h  # not a copy of W per row in the LM head (models/decoding.py)
        if keep is not None:  # shared prompts: the distinct prompts' part, then every row's response part
            keep.append(parts[0] if groups is None else torch.cat([parts[0][groups.inverse], parts[1]], dim=1))
        return h

    def opening(self, prompt_ids: Tensor, prompt_mask: Tensor, groups: PromptGroups | None = None) -> int:
        """k of `common_prefix` over the prompts (N, P) (of `groups`' distinct prompts when given) when
        computing it once saves more positions, k · (rows − 1), than a forward call costs; else 0
        (models/prefix.py)."""
        if groups is not None:
            prompt_ids, prompt_mask = prompt_ids[groups.first], prompt_mask[groups.first]
        k = common_prefix(prompt_ids, prompt_mask)
        return k if k * (prompt_ids.shape[0] - 1) > self.call_cost else 0

    def _responses(self, seq: Sequences, shared: bool) -> Tensor:
        """(N, T, H) at the positions predicting the response tokens: one plain forward, or with the
        prompts' common opening computed once when `shared` and worth it."""
        p = seq.prompt_len
        opening = self.opening(seq.ids[:, :p], seq.attention[:, :p]) if shared else 0
        if opening:
            return shared_prefix_hidden(self.lm.get_decoder(), seq.ids, seq.attention, seq.positions,
                                        seq.prompt_len, None, opening)
        return self._plain(seq)[:, seq.prompt_len - 1 : -1]

    def _plain(self, seq: Sequences) -> Tensor:
        """The decoder's last hidden state at every position, (N, P+T, H), in one plain forward."""
        out = self.lm.get_decoder()(
            input_ids=seq.ids, attention_mask=seq.attention, position_ids=seq.positions, use_cache=False
        )
        return out.last_hidden_state

    @torch.no_grad()
    def base_hidden(self, seq: Sequences) -> Tensor:
        """The frozen base's hidden state entering the critic's first layer L−k, (N, P+T, H): a no-grad
        forward of the layers below it only (adapters disabled). Only with the critic shortcut."""
        assert self.critic_shortcut
        with self.use("reference"):
            return layer_input(self.lm.get_decoder(), self.critic_start, lambda: self._plain(seq))

    def response_logits(self, seq: Sequences, temperature: float) -> Tensor:
        """Logits of the response tokens divided by the temperature: (N, T, V), float32 (float64 for a
        float64 model, which the exactness tests use)."""
        h = self.hidden(seq)
        return tempered(model_head(self.lm)(h), temperature)

    def response_stats(self, seq: Sequences, tokens: Tensor, mask: Tensor, temperature: float,
                       entropy: str = "off") -> tuple[Tensor, Tensor | None]:
        """log π(a_t|s_t) of the response tokens (N, T), 0 outside `mask` when chunked, and the
        entropy H_t (N, T) unless `entropy` is 'off' ('logged': no graph; 'trained'): at most
        `logits_chunk` positions' logits at once (models/logprobs.py), through the model's own logit
        transform where it has one (models/logit_head.py)."""
        return token_stats(model_head(self.lm), self.hidden(seq), tokens, mask, temperature, self.logits_chunk, entropy)

    def values(self, seq: Sequences, base: Tensor | None = None) -> Tensor:
        """V(s_t) for every response position: value_head(h_t), (N, T). Call under `use('critic')`.

        `base` (N, P+T, H): the frozen base's hidden state entering layer L−k (`base_hidden`, or kept
        from the reference forward); with the critic shortcut only the top k layers run, from it
        (the critic has no adapter below L−k, so its own hidden state there is the base's)."""
        assert self.value_head is not None
        if base is not None and self.critic_shortcut:
            with from_layer(self.lm.get_decoder(), self.critic_start, base):
                h = self._plain(seq)[:, seq.prompt_len - 1 : -1]
        else:
            h = self.hidden(seq)
        return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log softmax(logits)[token]: (N, T, V), (N, T) → (N, T)."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
