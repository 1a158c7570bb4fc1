"""Preference pairs from a verifier (`llmrl reward pairs`): the gold-reward setup of Gao et al. 2022,
*Scaling Laws for Reward Model Overoptimization*.

For each prompt x of a task's split the model's own policy draws K completions y_1 … y_K; the task's
reward (its verifier) grades each, r(x, y_k), and y_k is right when r(x, y_k) ≥ the task's `success`.
A prompt with at least one right and one wrong completion gives up to P pairs (chosen = a right
completion, rejected = a wrong one, distinct texts, never an empty one); a prompt whose K are all right
or all wrong gives none. Each pair is a row of TRL's preference format
(https://huggingface.co/docs/trl/dataset_formats, "preference"):

    {"prompt": x, "chosen": y_w, "rejected": y_l, "chosen_reward": r_w, "rejected_reward": r_l, "row": i}

with x, y_w, y_l plain text for a text prompt, and for a conversational prompt (a list of messages)
x the messages and y_w, y_l `[{"role": "assistant", "content": …}]`; `row` is the split's row index.

Determinism: completion k of split row i draws its uniforms from the key (seed, PAIRS_STEP, i, k)
(engines/base.row_keys), so a row's completions do not depend on the batch it lands in; the P pairs
of row i are the first P of its (right, wrong) combinations shuffled by random.Random(f"{seed}/{i}").
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..engines.base import GenerationEngine, GenerationRequest, SamplingSettings, row_keys
from ..errors import ConfigError, LLMRLError
from ..step.generate import decode, encode_prompts
from ..step.score import score_texts

PAIRS_STEP = -2
"""The `step` slot of the pairs' seed keys: neither a training step (≥ 0) nor the evaluation's (-1)."""

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class PairSettings:
    """What `make_pairs` samples and keeps.

    split             'train' or 'eval' (the held-out split: its prompts are never a train prompt)
    prompts           the first N rows of the split (None: every row)
    samples           K ≥ 2 completions per prompt
    pairs_per_prompt  P ≥ 1 pairs at most per prompt
    temperature, top_p, max_new_tokens   the sampling (softmax(logits / T) on the top-p nucleus)
    seed              keys the completions and the choice of pairs
    batch_size        completions per generate call (K of each prompt always in one call)
    """

    split: str = "train"
    prompts: int | None = None
    samples: int = 4
    pairs_per_prompt: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 5
    seed: int = 0
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ConfigError(f"--split must be train or eval; got '{self.split}'.")
        if self.samples < 2:
            raise ConfigError(f"--samples must be ≥ 2 (a pair needs a right and a wrong completion); got {self.samples}.")
        if self.pairs_per_prompt < 1 or (self.prompts is not None and self.prompts < 1):
            raise ConfigError("--pairs-per-prompt and --prompts must be ≥ 1.")


@dataclass(frozen=True)
class PairsResult:
    """pairs: the rows to write, prompt by prompt in split order; prompts: how many were sampled;
    all_right / all_wrong: prompts skipped because their K completions were all right / all wrong
    (blank completions left out: a prompt whose only wrong ones are blank counts as all right)."""

    pairs: list[dict[str, Any]]
    prompts: int
    all_right: int
    all_wrong: int

    def summary(self) -> str:
        paired = len({p["row"] for p in self.pairs})
        return (f"{self.prompts} prompts sampled, {len(self.pairs)} pairs from {paired} of them; skipped "
                f"{self.all_right} whose completions were all right and {self.all_wrong} all wrong.")


Graded = list[tuple[str, float]]
"""One prompt's K completions with their rewards, in sample order."""


@torch.no_grad()
def sample_graded(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]],
                  reward_fn: Callable[..., Sequence[float]], settings: PairSettings, *, role: str = "reference",
                  on_prompts: Callable[[int], None] = lambda n: None) -> list[Graded]:
    """K = settings.samples completions of each row's prompt under `role`, each graded by `reward_fn`
    (rows[i] is split row i: its index keys its samples). `on_prompts(n)` after each batch of n prompts."""
    k = settings.samples
    per = max(1, settings.batch_size // k)  # prompts per generate call
    sampling = SamplingSettings(settings.max_new_tokens, settings.temperature, settings.top_p)
    out: list[Graded] = []
    for start in range(0, len(rows), per):
        chunk = list(rows[start : start + per])
        ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in chunk], torch.device("cpu"))
        index = torch.arange(start, start + len(chunk)).repeat_interleave(k)
        keys = row_keys(settings.seed, PAIRS_STEP, index, torch.arange(k).repeat(len(chunk)))
        gen = engine.generate(GenerationRequest(ids, mask, k, sampling, keys, role=role))
        texts = decode(tokenizer, gen.response_ids, gen.response_mask)
        rewards = score_texts(reward_fn, [r for r in chunk for _ in range(k)], texts).tolist()
        out += [list(zip(texts[j * k : (j + 1) * k], rewards[j * k : (j + 1) * k], strict=True))
                for j in range(len(chunk))]
        on_prompts(len(chunk))
    return out


def pairs_of(row: dict[str, Any], index: int, graded: Graded, success: float, settings: PairSettings) -> list[dict[str, Any]]:
    """Up to P pairs of split row `index`: (right, wrong) combinations of its distinct non-empty
    completions (right: reward ≥ success), shuffled by random.Random(f"{seed}/{index}"), the first P."""
    right, wrong = _distinct(graded, lambda r: r >= success), _distinct(graded, lambda r: r < success)
    combos = [(w, l) for w in right for l in wrong if w[0] != l[0]]
    random.Random(f"{settings.seed}/{index}").shuffle(combos)
    return [preference_row(row["prompt"], w, l, index) for w, l in combos[: settings.pairs_per_prompt]]


def _distinct(graded: Graded, keep: Callable[[float], bool]) -> list[tuple[str, float]]:
    """The first of each distinct non-blank text whose reward `keep` accepts, in sample order (`llmrl
    reward train` refuses an empty answer)."""
    seen: dict[str, float] = {}
    for text, reward in graded:
        if keep(reward) and text.strip() and text not in seen:
            seen[text] = reward
    return list(seen.items())


def preference_row(prompt: Any, chosen: tuple[str, float], rejected: tuple[str, float], index: int) -> dict[str, Any]:
    """One line of TRL's preference format: text answers for a text prompt; for a conversational
    prompt each answer as one assistant message."""
    answer = (lambda t: t) if isinstance(prompt, str) else (lambda t: [{"role": "assistant", "content": t}])
    return {"prompt": prompt, "chosen": answer(chosen[0]), "rejected": answer(rejected[0]),
            "chosen_reward": chosen[1], "rejected_reward": rejected[1], "row": index}


def make_pairs(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]],
               reward_fn: Callable[..., Sequence[float]], success: float, settings: PairSettings, *,
               role: str = "reference", on_prompts: Callable[[int], None] = lambda n: None) -> PairsResult:
    """Sample, grade and pair the split's `rows` (row i of the list is split row i)."""
    graded = sample_graded(engine, tokenizer, rows, reward_fn, settings, role=role, on_prompts=on_prompts)
    pairs: list[dict[str, Any]] = []
    all_right = all_wrong = 0
    for i, (row, g) in enumerate(zip(rows, graded, strict=True)):
        found = pairs_of(row, i, g, success, settings)
        pairs += found
        if not found:  # no usable right completion: all wrong; else no usable wrong one: all right
            usable = {r >= success for t, r in g if t.strip()}
            all_wrong += True not in usable
            all_right += True in usable
    return PairsResult(pairs, len(rows), all_right, all_wrong)


# ---- the policy and the prompts --------------------------------------------------------------------


@dataclass(frozen=True)
class PairSource:
    """What `make_pairs` reads: the policy's engine and tokenizer, the role it samples under ('actor'
    for a run folder's trained actor, 'reference' for a plain model), the split's rows and the task."""

    engine: GenerationEngine
    tokenizer: PreTrainedTokenizerBase
    role: str
    rows: list[dict[str, Any]]
    task: Any
    settings: PairSettings


def open_source(model: str, task: str | None, split: str, *, prompts: int | None, samples: int,
                pairs_per_prompt: int, overrides: dict[str, Any], sets: list[str] | None,
                show_progress: bool = False) -> PairSource:
    """Settings as `llmrl train` reads them (defaults < the flags in `overrides` < `--set`), the task's
    split (its first `prompts` rows), then the model: a run folder's base and trained actor, or the plain
    model `model` (its base, adapters off), with the `hf` engine or `rollout.engine`'s as a run builds it."""
    from dataclasses import replace

    from ..config import load_config
    from ..engines import build_engine
    from ..models.load import load_base
    from ..models.prompts import apply_chat_setting
    from ..models.stack import PolicyStack
    from ..run.actor import load_actor, run_config
    from ..run.folder import MARKER
    from ..run.session import check_context
    from ..tasks import task_from_config

    settings = PairSettings(split, prompts, samples, pairs_per_prompt)  # the flags checked before anything loads
    run = Path(model).expanduser()
    is_run = (run / MARKER).is_file()
    name = run_config(run).model.name if is_run else model
    cfg = load_config(overrides={**overrides, "model.name": name, "task": task}, sets=sets)
    settings = replace(settings, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                       max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed, batch_size=cfg.eval.batch_size)
    chosen = task_from_config(cfg)
    if cfg.rollout.env or chosen.env:
        raise ConfigError(f"Task '{chosen.name}' is played in episodes (environment '{cfg.rollout.env or chosen.env}'), "
                          "which `llmrl reward pairs` does not sample; use a one-turn task or dataset.")
    rows = (chosen.train if split == "train" else chosen.eval)[:prompts]
    if not rows:
        raise ConfigError(f"Task '{chosen.name}' has no rows in its {split} split to sample.")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if is_run:
        device = cfg.model.device if any(s.startswith("model.device=") for s in sets or []) else None
        stack, tokenizer, _ = load_actor(run, device=device, show_progress=show_progress)
    else:
        base, tokenizer = load_base(cfg.model, show_progress=show_progress)
        stack = PolicyStack(base, cfg.lora, with_critic=False)
    apply_chat_setting(tokenizer, cfg.data.chat_template, name, cfg.data.system_prompt)
    check_context(replace(chosen, train=rows if split == "train" else [], eval=rows if split == "eval" else []),
                  tokenizer, stack.lm.config, settings.max_new_tokens)
    engine = build_engine(cfg.rollout.engine, stack=stack, tokenizer=tokenizer, config=cfg)
    return PairSource(engine, tokenizer, "actor" if is_run else "reference", rows, chosen, settings)


# ---- the output file -------------------------------------------------------------------------------

PAIR_KEYS = ("prompt", "chosen", "rejected", "row")


def check_out(path: Path, overwrite: bool) -> None:
    """Refuse an --out llmrl may not write: a folder, a file there without --overwrite, or (even with it)
    a file that is not a pairs file llmrl wrote (llmrl never replaces a file it did not write)."""
    if path.is_dir():
        raise ConfigError(f"--out '{path}' is a folder; give a file name such as {path / 'pairs.jsonl'}.")
    if not path.exists():
        return
    if not overwrite:
        raise ConfigError(f"--out '{path}' exists; pass --overwrite to replace it, or choose another file.")
    if not _ours(path):
        raise ConfigError(f"--out '{path}' exists and is not a pairs file llmrl wrote, so --overwrite leaves it "
                          "alone; choose another file.")


def _ours(path: Path) -> bool:
    """Whether `path`'s first line is a pair as `write_pairs` writes it."""
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(first, dict) and all(k in first for k in PAIR_KEYS)


def write_pairs(path: Path, pairs: Sequence[dict[str, Any]]) -> None:
    """One JSON object a line, into a temporary sibling renamed over `path` (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LLMRLError(f"Could not write the pairs to '{path}' ({exc.strerror or exc}).", exit_code=1) from None
