"""reasoning-gym as a task source: `task: rg:NAME` or `rg:NAME?key=value&key=value`.

reasoning-gym (`pip install 'llmrl[reasoning-gym]'`) generates about a hundred procedural reasoning
tasks offline, each item a {question, answer, metadata} and each dataset with its own
`score_answer(answer, entry) -> float` in [0, 1]. Here:

- prompt: the question, then the answer convention of `rg.answer` (`INSTRUCTIONS`: 'tag', "Put your
  final answer between <answer> and </answer> tags.", or 'line', "Write your final answer alone on the
  last line."), as one string: a chat model's template renders it as one user message
  (`models/prompts.py`), a model without one reads it raw;
- `answer` column: the item's answer; `rg_id` column: the item's place in this task's pool, which is
  how the reward finds the item's metadata for `score_answer`; `task` column: the task's name;
- reward (`reward`): `score_answer(strict_answer(c), item)`, where `strict_answer` is the content of
  the completion's last `<answer>…</answer>` pair (reasoning-gym's own `extract_answer`; no pair
  scores 0), or with `rg.answer: line` its last non-empty line as it is (no line scores 0).
  A scorer that raises on a completion scores it 0. `rg.reward: lenient` trains on `lenient` instead,
  `rg.reward: both` on (strict + lenient) / 2 (a right answer outside the tags earns half);
- metrics, reported by every evaluation: `strict_accuracy` = share of completions whose strict score
  is 1 (full credit), `lenient_accuracy` = share whose `lenient` score is 1, where `lenient` is the
  best `score_answer` over the looser readings of `lenient_candidates` (the tag's content, the text
  after an unclosed `<answer>`, the last non-empty line without tags, markdown, a leading
  "answer:" / "the answer is" and a final full stop, and the last number).

Held-out and train questions. Item i of a generator seeded s is drawn from `Random(s + i)` in
almost every reasoning-gym dataset, so the held-out pool is items 0..E−1 of the generator seeded
`data.split_seed` and the train pool items 0..N−1 of the one seeded `data.split_seed + TRAIN_OFFSET`
(E = rg.eval_size ≤ 100 000 < TRAIN_OFFSET = 10⁶, N = rg.train_size): disjoint seeds. A train
question whose text equals a held-out one (small task spaces repeat) is dropped, so the two splits
never share a question. The held-out set is fixed by (task, its config, rg.eval_size, data.split_seed)
and a run scores its first eval.size questions: two runs evaluate on the same questions.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from functools import cache
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import unquote

import yaml

from ..errors import ConfigError
from ..rewards.builtin import NUMBER

PREFIX = "rg:"
TRAIN_OFFSET = 10**6
OWN_KEYS = ("seed", "size")  # set by llmrl (data.split_seed, rg.train_size / rg.eval_size)
INSTRUCTION = "Put your final answer between <answer> and </answer> tags."
INSTRUCTIONS = {"tag": INSTRUCTION, "line": "Write your final answer alone on the last line."}
INSTALL = "pip install 'llmrl[reasoning-gym]' (from a clone: pip install -e '.[reasoning-gym]')"
Rows = list[dict[str, Any]]


def is_rg(name: str) -> bool:
    return name.startswith(PREFIX)


def require() -> Any:
    """The reasoning_gym module, or one sentence naming the package to install."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"reasoning-gym tasks need the 'reasoning-gym' package, which is not installed: {INSTALL}.") from None
    return reasoning_gym


def version() -> str | None:
    """The installed reasoning-gym's version (its `__version__` lags its releases), or None when it
    cannot be imported."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        require()
        return dist_version("reasoning-gym")
    except (ConfigError, PackageNotFoundError):
        return None


def names() -> list[str]:
    """Every reasoning-gym dataset name, sorted (the package must be installed)."""
    require()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse(spec: str) -> tuple[str, dict[str, Any]]:
    """'rg:NAME?k=v&k2=v2' → ('NAME', {k: v, k2: v2}), each value %-decoded ('+' stays '+') and read as
    YAML ('3' → 3, '[+, -]' → ['+', '-'], 'true' → True)."""
    body = spec[len(PREFIX):] if is_rg(spec) else spec
    name, _, query = body.partition("?")
    if not name:
        raise ConfigError(f"Task '{spec}' names no reasoning-gym dataset; write rg:NAME (see `llmrl tasks`).")
    pairs = []
    for part in query.split("&") if query else []:  # not parse_qsl: it reads '+' as a space (operators=+,-)
        key, eq, raw = part.partition("=")
        if not eq or not key:
            raise ConfigError(f"Task '{spec}': the settings after '?' must read key=value&key=value.")
        pairs.append((unquote(key), unquote(raw)))
    settings: dict[str, Any] = {}
    for key, raw in pairs:
        try:
            settings[key] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            settings[key] = raw
    return name, settings


def config_fields(name: str) -> dict[str, Any]:
    """{field: default} of dataset `name`'s config dataclass, without seed and size."""
    from reasoning_gym.factory import DATASETS

    cls = DATASETS[name][1]
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in OWN_KEYS:
            continue
        has = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out[f.name] = (f.default if f.default is not dataclasses.MISSING else f.default_factory()) if has else None
    return out


def check_settings(name: str, settings: Mapping[str, Any], spec: str) -> dict[str, Any]:
    """The generator's settings, checked against its config's fields (one sentence per mistake); for a
    list or tuple field a string 'a,b' or '[a, b]' is the list of its parts, a list becomes a tuple
    where the field is one."""
    fields = config_fields(name)
    out = {}
    for key, value in settings.items():
        if key in OWN_KEYS:
            raise ConfigError(f"Task '{spec}': '{key}' is set by llmrl (the held-out and train seeds are fixed: "
                              "data.split_seed; sizes: rg.eval_size, rg.train_size).")
        if key not in fields:
            raise ConfigError(f"Task '{spec}': reasoning-gym's '{name}' has no setting '{key}'; its settings: "
                              f"{', '.join(fields) or 'none'}.")
        if isinstance(fields[key], (tuple, list)) and isinstance(value, str):  # operators=+,- or [+, -]
            value = [v.strip() for v in value.strip().strip("[]()").split(",") if v.strip()]
        if isinstance(value, list):
            value = _as_members(value, fields[key], f"Task '{spec}': '{key}'")
        out[key] = tuple(value) if isinstance(fields[key], tuple) and isinstance(value, list) else value
    return out


def _as_members(values: list[Any], default: Any, what: str) -> list[Any]:
    """`values` as members of the Enum the default list holds (aiw's task_types=[siblings] are
    TaskType members in reasoning-gym, which calls .value on them); other lists unchanged."""
    kind = next((type(d) for d in default if isinstance(d, enum.Enum)), None) if isinstance(default, (list, tuple)) else None
    if kind is None:
        return values
    by_text = {str(m.value): m for m in kind} | {m.name.lower(): m for m in kind}
    out = []
    for v in values:
        member = v if isinstance(v, kind) else by_text.get(str(v).lower())
        if member is None:
            raise ConfigError(f"{what} takes {', '.join(str(m.value) for m in kind)}; not '{v}'.")
        out.append(member)
    return out


def _generator(name: str, settings: Mapping[str, Any], seed: int, size: int, spec: str) -> Any:
    from reasoning_gym.factory import create_dataset

    try:
        return create_dataset(name, **settings, seed=seed, size=size)
    except AssertionError as exc:  # reasoning-gym's configs validate with assert
        raise ConfigError(f"Task '{spec}': reasoning-gym refuses the settings: {exc or 'invalid value'}.") from None
    except Exception as exc:  # noqa: BLE001 - a wrong type reaches the generator's own code: one sentence
        raise ConfigError(f"Task '{spec}': reasoning-gym refuses the settings ({type(exc).__name__}: {exc}).") from None


def _items(gen: Any, size: int, spec: str) -> list[dict[str, Any]]:
    try:
        return [gen[i] for i in range(size)]
    except Exception as exc:  # noqa: BLE001 - a generator's own failure, for one sentence
        raise ConfigError(f"Task '{spec}': reasoning-gym's generator failed ({type(exc).__name__}: {exc}).") from None


@dataclasses.dataclass(frozen=True)
class Source:
    """One reasoning-gym task: its pools of items and the dataset object whose `score_answer` scores them.
    `items` holds the train pool then the held-out pool; a row's `rg_id` indexes it."""

    spec: str
    name: str
    settings: dict[str, Any]
    items: list[dict[str, Any]]
    n_train: int
    scorer: Any
    answer: str = "tag"  # the convention (rg.answer): 'tag' or 'line'

    def score(self, answer: str | None, rg_id: int) -> float:
        """reasoning-gym's `score_answer` of `answer` for item `rg_id` (0 for no answer or a scorer error)."""
        if answer is None:
            return 0.0
        try:
            return float(self.scorer.score_answer(answer, self.items[int(rg_id)]))
        except Exception:  # noqa: BLE001 - a scorer that chokes on a model's text gives no credit
            return 0.0


def load(spec: str, settings: Mapping[str, Any] | None = None, *, train_size: int, eval_size: int,
         split_seed: int, answer: str = "tag") -> Source:
    """The task `spec` ('rg:NAME?k=v…') with `settings` (a recipe's block) under the query's own:
    train_size train items (fewer when some equal held-out questions) and eval_size held-out items;
    `answer` the convention its prompts state and its strict score reads."""
    require()
    name, query = parse(spec)
    known = names()
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean 'rg:{close[0]}'?" if close else "; `llmrl tasks` lists them."
        raise ConfigError(f"reasoning-gym has no dataset '{name}'{hint}")
    merged = check_settings(name, {**(settings or {}), **query}, spec)
    held = _items(_generator(name, merged, split_seed, eval_size, spec), eval_size, spec)
    train_gen = _generator(name, merged, split_seed + TRAIN_OFFSET, train_size, spec)
    seen = {e["question"] for e in held}
    train = [e for e in _items(train_gen, train_size, spec) if e["question"] not in seen]
    if not train:
        raise ConfigError(f"Task '{spec}': every generated train question is also a held-out one (the task's "
                          "space is too small); widen its settings or lower rg.eval_size.")
    return Source(spec, name, merged, train + held, len(train), train_gen, answer)


def prompt(question: str, answer: str = "tag") -> str:
    """The question and the answer convention `answer` ('tag', 'line'), as the model reads it (before
    any chat template)."""
    return f"{question.rstrip()}\n\n{INSTRUCTIONS[answer]}"


def rows(source: Source, label: str) -> tuple[Rows, Rows]:
    """(train, held-out) rows: {prompt, answer, task, rg_id}."""
    out = [{"prompt": prompt(e["question"], source.answer), "answer": str(e["answer"]), "task": label, "rg_id": i}
           for i, e in enumerate(source.items)]
    return out[:source.n_train], out[source.n_train:]


def strict_answer(completion: str, answer: str = "tag") -> str | None:
    """The answer under convention `answer`: 'tag' the content of the last `<answer>…</answer>` pair,
    stripped (reasoning-gym's `extract_answer`); 'line' the last non-empty line, stripped of
    surrounding white space only. None: no answer."""
    if answer == "line":
        lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
        return lines[-1] if lines else None
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


_LEAD = re.compile(r"^(?:final answer|the answer is|answer)\s*[:=]?\s*", re.IGNORECASE)


def lenient_candidates(completion: str) -> list[str]:
    """Looser readings of an answer, in order: the tag's content, the text after a last unclosed
    `<answer>`, the last non-empty line (tags and surrounding `*` removed, spaces collapsed, a leading
    'answer:' / 'the answer is' and a final full stop dropped), the last number. Empty and repeated
    readings are left out."""
    found = []
    tagged = strict_answer(completion)
    if tagged is not None:
        found.append(tagged)
    if "<answer>" in completion:
        found.append(completion.rsplit("<answer>", 1)[1].replace("</answer>", "").strip())
    lines = [ln for ln in completion.replace("<answer>", "").replace("</answer>", "").splitlines() if ln.strip()]
    if lines:
        last = _LEAD.sub("", " ".join(lines[-1].split()).strip("*").strip())
        found.append(last[:-1].rstrip() if last.endswith(".") else last)
    numbers = NUMBER.findall(completion)
    if numbers:
        found.append(numbers[-1].replace(",", ""))
    return [f for f in dict.fromkeys(found) if f]


def strict_scores(source: Source, completions: Sequence[str], rg_id: Sequence[int]) -> list[float]:
    return [source.score(strict_answer(c, source.answer), i) for c, i in zip(completions, rg_id, strict=True)]


def lenient_scores(source: Source, completions: Sequence[str], rg_id: Sequence[int]) -> list[float]:
    return [max((source.score(a, i) for a in lenient_candidates(c)), default=0.0)
            for c, i in zip(completions, rg_id, strict=True)]


def reward_fns(source: Source, reward: str = "strict") -> tuple[Callable[..., list[float]], dict[str, Callable[..., list[float]]]]:
    """(reward, {strict_accuracy, lenient_accuracy}): plain callables `fn(prompts, completions, **columns)`;
    the reward is `rg.reward`'s: the strict score, 'exact' 1 only where that score is full (no partial
    credit: reasoning-gym's letter_counting gives 0.5 to '10' for 1), the lenient one, or 'both', their mean."""

    def full(scores: list[float]) -> list[float]:
        return [1.0 if s >= 1.0 else 0.0 for s in scores]

    def strict(prompts: Sequence[Any], completions: Sequence[str], rg_id: Sequence[int], **_: Any) -> list[float]:
        return strict_scores(source, completions, rg_id)

    def loose(prompts: Sequence[Any], completions: Sequence[str], rg_id: Sequence[int], **_: Any) -> list[float]:
        return lenient_scores(source, completions, rg_id)

    def exact(prompts: Sequence[Any], completions: Sequence[str], rg_id: Sequence[int], **_: Any) -> list[float]:
        return full(strict_scores(source, completions, rg_id))

    def both(prompts: Sequence[Any], completions: Sequence[str], rg_id: Sequence[int], **_: Any) -> list[float]:
        return [(s + lo) / 2 for s, lo in zip(strict_scores(source, completions, rg_id),
                                               lenient_scores(source, completions, rg_id), strict=True)]

    strict.__qualname__ = f"{source.spec} (strict)"
    exact.__qualname__ = f"{source.spec} (strict, full credit only)"
    loose.__qualname__ = f"{source.spec} (lenient)"
    both.__qualname__ = f"{source.spec} (strict + lenient) / 2"
    metrics = {"strict_accuracy": lambda p, c, rg_id, **_: full(strict_scores(source, c, rg_id)),
               "lenient_accuracy": lambda p, c, rg_id, **_: full(lenient_scores(source, c, rg_id))}
    return {"strict": strict, "exact": exact, "lenient": loose, "both": both}[reward], metrics


@cache
def describe(name: str) -> str:
    """The first line of dataset `name`'s docstring (for `llmrl tasks`)."""
    from reasoning_gym.factory import DATASETS

    doc = (DATASETS[name][0].__doc__ or "").strip().splitlines()
    return doc[0].strip() if doc else ""
