"""Built-in reward functions: `fn(prompts, completions, **options_and_columns) -> list[float]`.

Each takes the prompts and completions (row-aligned lists), its options (from the recipe entry)
and the dataset's other columns as keyword arguments, and returns one float per completion.

| name           | value for one completion c                                                  |
|----------------|-----------------------------------------------------------------------------|
| exact_match    | 1 if c.strip() == str(answer).strip() else 0                                 |
| numeric        | 1 if |last_number(c) − last_number(answer)| ≤ tolerance else 0 (0 if none)   |
| first_number   | 1 if |first_answer_number(c, prompt) − last_number(answer)| ≤ tolerance else 0: |
|                | only the first number stated after restating the question counts (strict)    |
| math           | 1 if math-verify finds c's answer equal to the answer (LaTeX, \\boxed{}, fractions, |
|                | units; `pip install 'llmrl[math]'`) else 0                                    |
| format         | 1 if the regex `pattern` matches c (`match`: search anywhere, or full) else 0 |
| length_penalty | −min(1, max(0, len(c) − target) / target): 0 up to `target` characters,      |
|                | falling linearly to −1 at 2·target                                          |
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any, Sequence

from ..errors import ConfigError

# Signed integers or decimals, with optional thousands separators: "-3", "1,234", "2.5" (a sentence's
# final full stop is not a decimal point: "19." reads as 19).
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def last_number(text: Any) -> float | None:
    """The last number written in `text` (a number is returned as is), or None when there is none."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    found = NUMBER.findall(str(text))
    return float(found[-1].replace(",", "")) if found else None


def numbers(text: Any) -> list[float]:
    """Every number written in `text`, in order ("12+9 = 21." → [12, 9, 21])."""
    return [float(x.replace(",", "")) for x in NUMBER.findall(str(text))]


def question_text(prompt: Any) -> str:
    """A prompt's text: the string itself, or the contents of its chat messages joined by newlines."""
    if isinstance(prompt, (list, tuple)):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)


def first_answer_number(completion: str, prompt: Any) -> float | None:
    """The first number `completion` states as its answer, or None when it states none.

    With q = the prompt's numbers (k of them) and c = the completion's: when c has more than k
    numbers and its first k are q in some order (a restated question: "12+9 = …", "9 + 12 = …",
    "The sum of 12 and 9 is …"), the answer is c[k]; otherwise c[0]. So "12+9 = 21" answers 21,
    "12+9 = 19 or 21" answers 19 and "21, or maybe 20" answers 21: hedging counts its first guess.
    """
    got, asked = numbers(completion), numbers(question_text(prompt))
    k = len(asked)
    if k and len(got) > k and sorted(got[:k]) == sorted(asked):
        got = got[k:]
    return got[0] if got else None


def _answers(columns: dict[str, Any], column: str) -> Sequence[Any]:
    if column not in columns:
        raise KeyError(f"the dataset has no '{column}' column")
    return columns[column]


def exact_match(prompts: Sequence[Any], completions: Sequence[str], column: str = "answer", **columns: Any) -> list[float]:
    """1.0 when the completion, stripped, equals the `column` value as a string, stripped; else 0.0."""
    answers = _answers(columns, column)
    return [1.0 if c.strip() == str(a).strip() else 0.0 for c, a in zip(completions, answers, strict=True)]


def numeric(prompts: Sequence[Any], completions: Sequence[str], column: str = "answer", tolerance: float = 1e-6,
            **columns: Any) -> list[float]:
    """1.0 when the last number in the completion equals the `column` value (its last number) within
    `tolerance`; 0.0 otherwise, and when the completion holds no number."""
    out = []
    for c, a in zip(completions, _answers(columns, column), strict=True):
        got, want = last_number(c), last_number(a)
        out.append(1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=tolerance) else 0.0)
    return out


def first_number(prompts: Sequence[Any], completions: Sequence[str], column: str = "answer", tolerance: float = 1e-6,
                 **columns: Any) -> list[float]:
    """1.0 when the first number the completion states after restating the question
    (`first_answer_number`) equals the `column` value (its last number) within `tolerance`, else
    0.0: the strict reading of a numeric answer, where "19 or 21" is wrong even when 21 is right."""
    out = []
    for p, c, a in zip(prompts, completions, _answers(columns, column), strict=True):
        got, want = first_answer_number(c, p), last_number(a)
        out.append(1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=tolerance) else 0.0)
    return out


def require_math_verify() -> None:
    """The `math` reward checks answers with Hugging Face's math-verify, an optional extra."""
    try:
        import math_verify  # noqa: F401
    except ImportError:
        raise ConfigError("Reward 'math' needs the 'math-verify' package, which is not installed: "
                          "pip install 'llmrl[math]' (from a clone: pip install -e '.[math]').") from None


def math_answer(prompts: Sequence[Any], completions: Sequence[str], column: str = "answer",
                **columns: Any) -> list[float]:
    """The built-in `math`: 1.0 when math-verify (what TRL's accuracy reward uses) parses an answer out
    of the completion (a \\boxed{} answer first, else LaTeX or a plain expression, units dropped) that
    equals the `column` value as mathematics (\\frac{1}{2} = 0.5 = 1/2); else 0.0. The answer is read as
    text, else inside $…$ (so `x+1` reads); one that neither reads (a blank one) raises a ValueError."""
    from math_verify import parse, verify

    # math-verify bounds each parse and comparison with signal.alarm, which only the main thread may set
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    golds: dict[str, list[Any]] = {}
    out = []
    for c, a in zip(completions, _answers(columns, column), strict=True):
        text = str(a)
        if text not in golds:
            golds[text] = parse(text, parsing_timeout=timeout) or parse(f"${text}$", parsing_timeout=timeout)
            if not golds[text]:
                raise ValueError(f"math-verify cannot read the answer {text!r} as mathematics")
        got = parse(c, parsing_timeout=timeout)
        out.append(1.0 if got and verify(golds[text], got, timeout_seconds=timeout) else 0.0)
    return out


def format(prompts: Sequence[Any], completions: Sequence[str], pattern: str = "", match: str = "search",
           **columns: Any) -> list[float]:
    """1.0 when the regex matches (re.DOTALL: '.' spans lines); `match` is 'search' (anywhere) or 'full'."""
    rx = re.compile(pattern, re.DOTALL)
    test = rx.fullmatch if match == "full" else rx.search
    return [1.0 if test(c) else 0.0 for c in completions]


def length_penalty(prompts: Sequence[Any], completions: Sequence[str], target: int = 100, **columns: Any) -> list[float]:
    """−min(1, max(0, len(c) − target) / target) with lengths in characters."""
    return [-min(1.0, max(0, len(c) - target) / target) for c in completions]


BUILTINS = {"exact_match": exact_match, "numeric": numeric, "first_number": first_number, "math": math_answer,
            "format": format, "length_penalty": length_penalty}
COLUMN_READERS = ("exact_match", "numeric", "first_number", "math")  # built-ins that read a dataset column (option `column`)
NUMBER_READERS = ("numeric", "first_number")  # built-ins that compare with the number the column holds


def answer_readers(specs: Any) -> dict[str, str]:
    """{column: the built-in reward that reads it} for the entries of `reward.functions` that read one."""
    readers: dict[str, str] = {}
    for spec in specs or ():
        entry = {"name": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, dict) else {}
        if entry.get("name") in COLUMN_READERS:
            readers.setdefault(str(entry.get("column", "answer")), entry["name"])
    return readers


def check_answer(value: Any, column: str, reader: str, where: str) -> None:
    """Refuse (ConfigError, before the run) an answer the built-in `reader` could never match: it reads a
    string or a finite number (not a bool, None, a list or a dict); `numeric` and `first_number` need a
    number in it. `where`: 'Row 3 of dataset 'd.jsonl''."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (isinstance(value, str) or is_number) or (is_number and not math.isfinite(value)):
        what = "None" if value is None else repr(value)[:60] if is_number else f"a {type(value).__name__}"
        raise ConfigError(f"{where}: column '{column}', which reward '{reader}' reads, holds {what}, not a string "
                          "or a finite number.")
    if reader in NUMBER_READERS and last_number(value) is None:
        raise ConfigError(f"{where}: column '{column}' holds {value[:60]!r}, in which reward '{reader}' finds no "
                          "number, so no completion could ever match it.")
