"""The built-in default model `tiny`: a small Llama warm-started on the arithmetic task.

The model is a `transformers.LlamaForCausalLM` whose config is built here, on the character
tokenizer of `llmrl.models.tokenizer`. Before any RL run uses it, a short supervised phase on the
arithmetic train split makes it competent but clearly imperfect (about a third of the held-out
sums right under greedy decoding), so that RL has room to raise it. The result is cached on disk and
loads with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from llmrl.config.model_defaults import TINY_SHAPES
from llmrl.models.tokenizer import build_char_tokenizer

Segments = tuple[tuple[str, bool], ...]
"""A transcript: (text, trained) segments in order; a trained segment is the model's turn, followed by
EOS (its stop token) and carrying the loss, the others are context (a prompt, a tool's answer)."""
Corpus = Sequence[tuple[str, str] | Segments]
"""What a warm start trains on: (prompt, answer) pairs (the arithmetic task's train split for `tiny`:
tasks/__init__.py), the same as ((prompt, False), (answer, True)), or transcripts of several turns
(`tiny-tools`: tasks/calc.py `tool_transcripts`)."""

TINY_VERSION = "2"
"""Part of the cache folder name; bump it whenever the recipe below changes (2: two heads of 32
dimensions instead of four of 16, the smallest head vLLM's CPU attention supports)."""

PROGRESS_DESCRIPTION = "Warm-starting the built-in tiny model"


@dataclass(frozen=True)
class TinyRecipe:
    """Architecture and supervised warm-start hyperparameters of the `tiny` model."""

    hidden_size: int = TINY_SHAPES[0]
    num_layers: int = 2
    num_heads: int = 2  # head_dim = 64 / 2 = 32: vLLM's CPU attention kernels need head_dim ≥ 32
    intermediate_size: int = TINY_SHAPES[1]
    steps: int = 500
    batch_size: int = 256
    lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01


RECIPE = TinyRecipe()


def default_cache_dir(name: str = "tiny", version: str = TINY_VERSION) -> Path:
    """`$LLMRL_CACHE_DIR`, else `$XDG_CACHE_HOME/llmrl` (default `~/.cache/llmrl`), / `<name>-<version>`."""
    root = os.environ.get("LLMRL_CACHE_DIR")
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llmrl"
    return base / f"{name}-{version}"


def _build_model(tokenizer: PreTrainedTokenizerFast, recipe: TinyRecipe) -> LlamaForCausalLM:
    """A randomly initialised Llama with the recipe's sizes and the tokenizer's vocabulary."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _segments(entry: tuple[str, str] | Segments) -> Segments:
    """A corpus entry as segments: a (prompt, answer) pair is ((prompt, False), (answer, True))."""
    if isinstance(entry[0], str):
        prompt, answer = entry
        return ((prompt, False), (str(answer), True))
    return entry  # type: ignore[return-value]


def _encode_train(tokenizer: PreTrainedTokenizerFast, corpus: Corpus) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded training rows of the corpus: each entry's segments in order, a trained one followed by EOS.

    Returns `(ids, attention_mask, loss_mask)`, each `[N, L]`; `loss_mask[i, t]` is 1 where token
    `t` is a character of a trained segment or its EOS (the tokens the model is trained to predict).
    """
    rows: list[tuple[list[int], list[bool]]] = []
    for entry in corpus:
        seq: list[int] = []
        trained: list[bool] = []
        for text, is_model in _segments(entry):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if is_model else [])
            seq += ids
            trained += [is_model] * len(ids)
        rows.append((seq, trained))
    length = max(len(seq) for seq, _ in rows)
    ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(rows), length), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, (seq, trained) in enumerate(rows):
        ids[i, length - len(seq):] = torch.tensor(seq)
        attn[i, length - len(seq):] = 1
        loss_mask[i, length - len(seq):] = torch.tensor(trained)
    return ids, attn, loss_mask


def _lr_factor(step: int, recipe: TinyRecipe) -> float:
    """Linear warmup to 1, then cosine decay to 0.1: `0.1 + 0.45 (1 + cos(pi p))`, p in [0, 1]."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    p = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, p)))


def _warm_start(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    recipe: TinyRecipe,
    corpus: Corpus,
    *,
    seed: int,
    show_progress: bool,
) -> None:
    """Supervised warm start: `recipe.steps` AdamW steps on shuffled batches of the corpus.

    Loss = mean cross-entropy of `logits[:, t-1]` against `ids[:, t]` over positions t with
    `loss_mask` set (the model's characters and EOS); prompt, tool and padding tokens carry no loss.
    """
    ids, attn, loss_mask = _encode_train(tokenizer, corpus)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=recipe.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, recipe))
    order = torch.randperm(len(ids), generator=generator)
    cursor = 0
    model.train()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task(PROGRESS_DESCRIPTION, total=recipe.steps, loss=float("nan"))
        for _ in range(recipe.steps):
            if cursor + recipe.batch_size > len(order):
                order, cursor = torch.randperm(len(ids), generator=generator), 0
            batch = order[cursor : cursor + recipe.batch_size]
            cursor += recipe.batch_size
            x, m, lm = ids[batch], attn[batch], loss_mask[batch]
            logits = model(input_ids=x, attention_mask=m).logits  # [B, L, V]
            loss = F.cross_entropy(logits[:, :-1][lm[:, 1:]], x[:, 1:][lm[:, 1:]])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            progress.update(task, advance=1, loss=loss.item())
    model.eval()


@contextmanager
def no_hf_progress_bars() -> Iterator[None]:
    """Silence transformers' own tqdm bars (e.g. "Writing model shards") inside the block."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_tiny(
    out_dir: Path, corpus: Corpus, *, seed: int = 0, show_progress: bool = True, steps: int | None = None
) -> Path:
    """Build, warm-start and save the `tiny` model and its tokenizer into `out_dir`, atomically.

    Everything is written into a temporary sibling folder that is then renamed to `out_dir`, so
    `out_dir` exists only once complete. If another process renamed its build into `out_dir`
    first, this build is discarded and the existing folder is returned. `steps` overrides the
    recipe's step count (tests use a few steps). Deterministic for a given `seed` and thread count.
    """
    out_dir = Path(out_dir)
    recipe = RECIPE if steps is None else TinyRecipe(**{**RECIPE.__dict__, "steps": steps})
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer()
    model = _build_model(tokenizer, recipe)
    _warm_start(model, tokenizer, recipe, corpus, seed=seed, show_progress=show_progress)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with no_hf_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, out_dir)  # atomic; replaces only an empty `out_dir`
        except OSError:
            if not _is_complete(out_dir):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _is_complete(path: Path) -> bool:
    """True when `path` is a finished build (it only ever appears through the final rename)."""
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def ensure_tiny(corpus: Callable[[], Corpus], cache_dir: Path | None = None, *, show_progress: bool = True,
                steps: int | None = None) -> Path:
    """The cached `tiny` model folder (default `default_cache_dir()`), built first if missing.

    `steps`: the warm start's steps, if not the recipe's. Safe under concurrent callers: each builds into its own temporary folder and the losers of
    the final rename use the winner's folder.
    """
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if _is_complete(path):
        return path
    return build_tiny(path, corpus(), show_progress=show_progress, steps=steps)
