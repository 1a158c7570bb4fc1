"""plan_run: the whole run's memory, phase by phase, made before the model loads.

From the config, the model's config.json and its checkpoint's headers and file sizes (shape.py; no weight
is read) and the longest prompt in tokens, each phase of a run is a tuple of parts (parts.py's formulas):
"held" parts stay from phase to phase (the process, the base, adapters, AdamW), "transient" ones are freed
when the phase ends. A phase's peak is its held parts plus its transients; the plan's peak is the largest:

    load        process, base as held; the checkpoint's mapped pages while it is read (a float checkpoint
                read while quantising, or one converted to another dtype)
    evaluate    + adapters, value head, AdamW; the engine's float copies, KV cache, logits and one layer's
                prefill at the evaluation's batch width  E = min(eval.batch_size, eval.size)
    generate    the same at a step's rows  N_gen = (B + oversample)·G  (vLLM: its weights and KV cache)
    score       a reward model's scoring batch (reward.batch_size rows)
    forwards    the no-grad log-prob/value forwards of the step's N = B·G rows: one layer's intermediates,
                the logits (whole or in chunks)
    update      activations  m · S · a · ACT_SLACK  of a micro-batch of m rows, its logits, the gradients
    checkpoint  the trainable weights and AdamW state serialised before they are written

m is the micro-batch the run will take: update.micro_batch_size, else the minibatch or the rows whose
activations fit the budget as run/update_fit decides after loading (its SLACK of 2), so the plan predicts
the run as it will be; the fit itself still measures `a` by its probe once the model is loaded (the
measured figure decides; the plan's formula only predicts). The plan made before loading is what
`llmrl train --plan` prints and what summary.json's `predicted_peak_mib` records.

The process part is measured: this process's resident memory when the plan is made (python, torch,
transformers and llmrl imported, ≈ 380 MiB) plus RUNTIME, what a run's first kernels, thread pools,
tokenizer and the model's loading add whatever the model: 100 MiB, from the tiny default run (its arrays < 60 MiB),
whose load phase peaks 70 MiB above the process measured here and whose update 150 MiB above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..estimators import get_estimator
from ..algos import preset_for
from ..models.load import torch_dtype
from . import parts as p
from .shape import ModelShape

PHASES = ("load", "evaluate", "generate", "score", "forwards", "update", "checkpoint")
HELD, TRANSIENT = "held", "transient"
RUNTIME = 100 * 2**20  # bytes a run adds to the imported process whatever the model (module docstring)
FIT_SLACK = 2.0  # run/update_fit.SLACK: the fit's margin, used here only to predict the rows it chooses


@dataclass(frozen=True)
class Part:
    """One thing the run holds in a phase: `bytes` of it, "held" (stays) or "transient" (freed after)."""
    name: str
    bytes: int
    kind: str


@dataclass(frozen=True)
class MemoryPlan:
    """Every phase's parts (PHASES order), the budget they are planned against and its source."""
    phases: tuple[tuple[str, tuple[Part, ...]], ...]
    budget: int
    budget_source: str

    def phase_bytes(self, phase: str) -> int:
        return sum(part.bytes for part in dict(self.phases)[phase])

    @property
    def peak_phase(self) -> str:
        return max((name for name, _ in self.phases), key=self.phase_bytes)

    @property
    def peak_bytes(self) -> int:
        """max over phases of held + that phase's transients."""
        return self.phase_bytes(self.peak_phase)

    def rows(self) -> list[tuple[str, str, int, str]]:
        """(phase, part, bytes, kind) for the table: each phase's held parts first, then its transients."""
        return [(phase, part.name, part.bytes, part.kind) for phase, items in self.phases
                for part in sorted(items, key=lambda x: x.kind != HELD) if part.bytes]


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS), 0 where /proc cannot say."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _needs_critic(config: Config) -> bool:
    return get_estimator(config.estimator.name or preset_for(config.algo)["estimator.name"]).needs.critic


def _response_tokens(config: Config) -> int:
    """T: rollout.max_new_tokens, or an environment's episode budget (max_episode_tokens, else turns × tokens)."""
    r = config.rollout
    return r.max_new_tokens if not r.env else (r.max_episode_tokens or r.max_turns * r.max_new_tokens)


def _held(config: Config, shape: ModelShape, b: int, baseline: int, extra: tuple[Part, ...]) -> dict[str, Part]:
    """Parts held through the run, by name, and the trainable numbers (actor + critic)."""
    lora, four = config.lora, config.model.quantize != "none"
    actor = p.lora_numbers(shape, lora.r, lora.target_modules)
    critic = (p.lora_numbers(shape, lora.r, lora.target_modules, lora.critic_layers) + shape.hidden + 1
              if _needs_critic(config) else 0)
    held = [Part("process (python, torch, llmrl) and run-time", baseline, HELD),
            Part("base" + (f" ({config.model.quantize} codes + scales)" if four else ""),
                 p.base_bytes(shape, b, four), HELD),
            Part("actor LoRA adapter", actor * p.FLOAT32, HELD),
            Part("critic LoRA adapter + value head", critic * p.FLOAT32, HELD),
            Part("AdamW state (2 × float32)", p.ADAMW_STATES * p.FLOAT32 * (actor + critic), HELD), *extra]
    return {part.name: part for part in held}


def _engine(config: Config, shape: ModelShape, b: int, rows: int, prompt: int, tokens: int) -> list[Part]:
    """The generation engine's transients at `rows` rows: its float copies, KV cache, logits, the prefill."""
    e, cpu = config.engine, config.model.device != "cuda"
    if config.rollout.engine == "vllm":
        return [Part("vLLM weights", shape.numbers * b, TRANSIENT),
                Part(f"vLLM KV cache ({rows} rows)", int(1.25 * p.kv_bytes(shape, min(rows, e.max_num_seqs),
                                                                         p.rounded_up(tokens, 128), b)), TRANSIENT)]
    out = []
    if cpu and e.pack_weights and shape.hidden >= 256:  # models/packed.MIN_HIDDEN
        out.append(Part("hf engine: packed linear weights", (shape.linear_numbers + shape.vocab * shape.hidden) * b,
                        TRANSIENT))
    elif e.merge_lora:
        out.append(Part("hf engine: merged actor", shape.layers * sum(
            i * o for _, i, o in p.targets(shape, config.lora.target_modules)) * b, TRANSIENT))
    return out + [Part(f"KV cache ({rows} rows × {tokens} tokens)", p.kv_bytes(shape, rows, tokens, b), TRANSIENT),
                  Part("logits (one position a row)", p.logits_bytes(shape, rows), TRANSIENT),
                  Part("prefill (one layer)", p.layer_bytes(shape, rows, prompt, b), TRANSIENT)]


def _tokens(config: Config, rows: int, prompt: int, answer: int, grad: bool, world: int) -> int:
    """Positions a forward of `rows` rows runs: N·(P+T), or with model.share_prompts each distinct prompt once,
    N·T + U·P, U = min(N, prompts a step on this process) at most, where models/prefix.distinct_prompts shares
    them (2U ≤ N); a gradient forward shares only without activation checkpointing and LoRA dropout
    (models/stack.PolicyStack.hidden)."""
    distinct = min(rows, p.ceil_div(config.rollout.prompts_per_step, world))
    shared = config.model.share_prompts and 2 * distinct <= rows and not (
        grad and (config.update.activation_checkpointing or config.lora.dropout > 0))
    return rows * answer + distinct * prompt if shared else rows * (prompt + answer)


def _micro_rows(config: Config, shape: ModelShape, a: float, free: int, row: int, answer: int, world: int) -> int:
    """m: update.micro_batch_size, else the minibatch's rows or the rows the fit will find room for."""
    r, u = config.rollout, config.update
    minibatch = p.ceil_div(min(u.minibatch_size, r.prompts_per_step * r.num_generations), world)
    if u.micro_batch_size:
        return min(u.micro_batch_size, minibatch)
    per_token = a + 2 * p.FLOAT32 * shape.vocab * answer / row
    return max(1, min(minibatch, int(free // (row * per_token * FIT_SLACK))))


def plan_run(config: Config, budget: Any, *, shape: ModelShape, prompt_tokens: int, baseline: int | None = None,
             world: int = 1, extra: tuple[Part, ...] = ()) -> MemoryPlan:
    """The run's MemoryPlan against `budget` (bytes, source), from the model's `shape` (shape.read_shape) and the
    longest prompt; `baseline`: the process part (default: this process's resident memory + RUNTIME);
    `extra`: held parts found elsewhere (a reward model: plan_for)."""
    b = torch_dtype(config.model.dtype, config.model.device, config.model.name).itemsize
    r, lora = config.rollout, config.lora
    answer, prompt = _response_tokens(config), max(1, prompt_tokens)
    row = prompt + answer
    base = resident_bytes() + RUNTIME if baseline is None else baseline
    held = _held(config, shape, b, base, extra)
    trainable = (held["actor LoRA adapter"].bytes + held["critic LoRA adapter + value head"].bytes) // p.FLOAT32
    rows = p.ceil_div(r.prompts_per_step * r.num_generations, world)
    gen_rows = p.ceil_div((r.prompts_per_step + r.oversample) * r.num_generations, world)
    evals = min(config.eval.batch_size, config.eval.size)
    a = p.update_bytes_per_token(shape, b, lora.r, lora.target_modules, config.update.activation_checkpointing)
    micro = _micro_rows(config, shape, a, budget.bytes - sum(x.bytes for x in held.values()), row, answer, world)
    positions = _tokens(config, micro, prompt, answer, True, world)
    four = config.model.quantize != "none"
    loading = shape.file_bytes if four or b * shape.numbers != shape.file_bytes else 0
    scoring = [x for x in extra if x.bytes] and [
        Part(f"scoring batch (one layer, {config.reward.batch_size} rows)",
             p.layer_bytes(shape, config.reward.batch_size, row, b), TRANSIENT)]
    transients = {
        "load": [Part("checkpoint pages read while loading", loading, TRANSIENT)],
        "evaluate": _engine(config, shape, b, evals, prompt, row) if evals else [],
        "generate": _engine(config, shape, b, gen_rows, prompt, row),
        "score": list(scoring or []),
        "forwards": [Part(f"no-grad forward ({rows} rows, one layer)",
                          p.layer_bytes(shape, 1, _tokens(config, rows, prompt, answer, False, world), b), TRANSIENT),
                     Part("log-prob logits", p.logits_held(shape, rows * answer, config.model.logits_chunk_mib),
                          TRANSIENT)],
        "update": [Part(f"activations ({micro} rows, {positions:,} positions × {a / 1024:,.1f} KB)",
                        int(positions * a * p.ACT_SLACK), TRANSIENT),
                   Part("update logits", p.logits_held(shape, micro * answer, config.model.logits_chunk_mib), TRANSIENT),
                   Part("gradients (float32)", p.FLOAT32 * trainable, TRANSIENT)],
        "checkpoint": [Part("checkpoint bytes in memory", p.checkpoint_bytes(trainable), TRANSIENT)],
    }
    load_held = tuple(held[k] for k in list(held)[:2])
    phases = tuple((name, (load_held if name == "load" else tuple(held.values())) + tuple(transients[name]))
                   for name in PHASES)
    return MemoryPlan(phases, int(budget.bytes), str(budget.source))
