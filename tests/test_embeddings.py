"""LoRA on an input embedding is trained and reaches an engine's copy; a tied LM head and embedding
are never merged into one weight behind the trainer's back (issue 31, items 1 and 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.config.schema import LoraConfig, UpdateConfig
from llmrl.engines.actor_weights import ActorSnapshot, actor_is_base, actor_tensors, changed_names
from llmrl.errors import ConfigError
from llmrl.models.stack import PolicyStack, of_adapter, tied_embeddings
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.run.actor import _load_checkpoint_actor, merge_actor
from llmrl.run.checkpoint import trainable_state
from llmrl.step.update import make_optimizers

from tests.conftest import make_tiny_model

IDS = torch.tensor([[1, 5, 6, 7, 9, 12]])


def _tied_model() -> LlamaForCausalLM:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg).eval()


def _stack(model, **lora) -> PolicyStack:
    return PolicyStack(model, LoraConfig(r=4, alpha=8.0, **lora), with_critic=True)


def _move(stack: PolicyStack, only: str | None = None, seed: int = 1) -> None:
    """Write random values into the actor's parameters (those whose name contains `only`)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if of_adapter(name, "actor") and (only is None or only in name):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def test_peft_names_an_embeddings_lora_without_a_trailing_component() -> None:
    assert of_adapter("base_model.model.model.embed_tokens.lora_embedding_A.actor", "actor")
    assert of_adapter("base_model.model.model.layers.0.self_attn.q_proj.lora_A.actor.weight", "actor")
    assert not of_adapter("base_model.model.model.embed_tokens.lora_embedding_A.critic", "actor")
    assert not of_adapter("base_model.model.model.layers.0.reactor.weight", "actor")


def test_every_trainable_parameter_of_an_embedding_lora_is_optimised_and_checkpointed() -> None:
    stack = _stack(make_tiny_model(), target_modules=["q_proj", "embed_tokens"])
    trainable: set[str] = set()
    for role in ("actor", "critic"):  # peft makes only the active adapter's parameters trainable
        with stack.use(role):
            trainable |= {n for n, p in stack.peft.named_parameters() if p.requires_grad}
    embedding = {n for n in trainable if "lora_embedding" in n}
    assert len(embedding) == 4  # A and B of the actor and of the critic
    opts = make_optimizers(stack, UpdateConfig())
    optimised = {id(p) for o in opts.values() for g in o.param_groups for p in g["params"]}
    named = dict(stack.peft.named_parameters())
    assert {n for n in trainable if id(named[n]) not in optimised} == set()
    assert {f"peft.{n}" for n in embedding} <= set(trainable_state(stack))


def test_an_embeddings_lora_reaches_the_engines_weights_and_the_snapshot_sees_it() -> None:
    stack = _stack(make_tiny_model(), target_modules=["q_proj", "embed_tokens"])
    assert "model.embed_tokens.weight" in changed_names(stack)
    assert actor_is_base(stack)  # peft starts an embedding's A at 0: s·B·A = 0
    snapshot = ActorSnapshot(stack)
    _move(stack, only="lora_embedding")
    assert not snapshot.matches(stack) and not actor_is_base(stack)
    pushed = actor_tensors(stack, ["model.embed_tokens.weight"], torch.float32)["model.embed_tokens.weight"]
    with stack.use("actor"), torch.no_grad():
        looked_up = stack.lm.get_input_embeddings()(IDS)  # what the actor's forward embeds
    torch.testing.assert_close(pushed[IDS], looked_up, atol=1e-6, rtol=0)
    base = stack.peft.base_model.model.model.embed_tokens.base_layer.weight
    assert (pushed - base).abs().max() > 1e-3  # the engine's embedding moved with the actor


def test_a_checkpoints_embedding_lora_is_loaded_for_eval_and_export(tmp_path: Path) -> None:
    trained = _stack(make_tiny_model(), target_modules=["q_proj", "embed_tokens"])
    _move(trained)
    path = tmp_path / "trainable.safetensors"
    save_file(trainable_state(trained), str(path))  # as save_checkpoint writes it
    fresh = PolicyStack(make_tiny_model(), LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "embed_tokens"]),
                        with_critic=False)
    _load_checkpoint_actor(fresh, path)
    with torch.no_grad(), trained.use("actor"), fresh.use("actor"):
        torch.testing.assert_close(fresh.lm(IDS).logits, trained.lm(IDS).logits, atol=1e-6, rtol=0)


def test_tied_embeddings_are_found() -> None:
    assert tied_embeddings(_tied_model()) == ["model.embed_tokens", "lm_head"]
    assert tied_embeddings(make_tiny_model()) == []


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_lora_on_a_tied_head_or_embedding_is_refused(target: str) -> None:
    """A merge writes W + s·B·A into the one weight the head and the embedding share: both would change."""
    with pytest.raises(ConfigError, match=f"puts LoRA on '{target}', but this model ties its LM head to its input "
                                          "embedding"):
        _stack(_tied_model(), target_modules=["q_proj", target])


@pytest.mark.parametrize("saved", ["lm_head", "embed_tokens"])
def test_a_trained_copy_of_a_tied_head_or_embedding_merges_into_what_the_actor_computes(saved: str, tmp_path: Path) -> None:
    """lora.modules_to_save unties (peft copies the module): the hf engine and the export keep it apart."""
    stack = _stack(_tied_model(), target_modules=["q_proj"], modules_to_save=[saved])
    _move(stack)
    with stack.use("actor"), torch.no_grad():
        want = stack.lm(IDS).logits
    merged = merge_actor(stack)
    merged.save_pretrained(tmp_path)
    back = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, want, atol=1e-5, rtol=0)
