"""`dist.shard_base`: shard the frozen base model's decoder layers over the processes with FSDP2.

    for layer in decoder.layers:  fully_shard(layer, ignored_params=<the LoRA adapters' parameters>)

Each process then holds 1/W of every decoder layer's frozen weights (the bulk of a model: all but
the embeddings, final norm and LM head, which stay replicated) and all-gathers a layer just before
using it. The trainable parameters (LoRA adapters, value head) are *ignored* by FSDP: they stay
ordinary replicated tensors, so gradient summing (distributed.py), clipping, the optimizers,
checkpoints and the saved adapters work exactly as in an unsharded data-parallel run.

What sharding adds: every forward is now a collective, so every process must run the same number
of them. Decoding stops only when every row on every process is done (`DistContext.all_done`), the
update pads a process's micro-batches with zero-weight ones up to the most any process runs
(`DistContext.lockstep`), and evaluation runs all held-out prompts on every process.
"""

from __future__ import annotations

from dataclasses import replace

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .distributed import DistContext
from ..errors import ConfigError
from ..models.stack import PolicyStack


def shard_base(stack: PolicyStack, dist: DistContext) -> DistContext:
    """Apply fully_shard to every decoder layer of `stack` (adapters excluded); returns the context
    with `lockstep` set, which the run passes on to everything that makes collective forwards
    (the engine, the update, evaluation)."""
    if stack.critic_shortcut:
        raise ConfigError("'lora.critic_layers' runs the critic from a layer in the middle of the sharded decoder, "
                          "which 'dist.shard_base' does not support; set lora.critic_shortcut=false or leave one off.")
    if not dist.active:
        raise ConfigError("'dist.shard_base' shards the base over the processes of a torchrun run; "
                          "launch with --nproc N (N ≥ 2) or torchrun, or leave it off.")
    trainable = {p for role in stack.trainable_roles() for p in stack.parameters_of(role)}
    # the mesh on the run's device: FSDP's default is the machine's accelerator, which would move a
    # CPU (gloo) run's layers to a GPU whenever the machine has one
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for layer in stack.lm.get_decoder().layers:
        fully_shard(layer, mesh=mesh, ignored_params={p for p in layer.parameters() if p in trainable})
    stack.share_prompts = False  # every forward is a collective: all ranks must make the same calls
    stack.length_buckets = False  # nor length groups (models/buckets.py), whose number differs by rank
    return replace(dist, lockstep=True)
