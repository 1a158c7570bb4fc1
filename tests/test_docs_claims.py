"""The docs' sentences about what is not built or not measured *yet* (issue 59, item 10), checked against
the code: docs say the present, so each such claim is listed here with a check that holds while the
claim is true. A new "yet" / "not built" sentence in docs/ or the README fails the first test until it is
listed (as a claim with its check, or as a sentence about a run's state, not the project's); building
what a claim says is missing fails its check, until the docs say the new present.

docs/history.md is the past by design and is not read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"\byet\b|\bnot built\b", re.IGNORECASE)


def _code() -> str:
    """Every line of llmrl/'s Python source."""
    return "\n".join(p.read_text() for p in sorted((ROOT / "llmrl").rglob("*.py")))


def _no_gpu_results() -> bool:
    """No result in bench/results came from a GPU (bench/gpu_table.sh writes results-vs-trl-*/roofline-* files
    whose `device` names CUDA; any file named for a GPU or CUDA counts too)."""
    names = [p.name.lower() for p in (ROOT / "bench" / "results").iterdir()]
    texts = [p.read_text(errors="replace") for p in (ROOT / "bench" / "results").glob("*.json")]
    return not any("gpu" in n or "cuda" in n for n in names) and not any('"cuda' in t.lower() for t in texts)


def _episodes_refuse_several_processes() -> bool:
    return "do not run with several processes yet" in _code()


def _no_env_adapters() -> bool:
    """llmrl imports neither `verifiers` nor OpenEnv (`openenv`, `envs` of openenv-core) anywhere."""
    return not re.search(r"^\s*(from|import)\s+(verifiers|openenv)\b", _code(), re.MULTILINE)


def _turns_are_synchronous() -> bool:
    """The `hf` engine's episode batch decodes turn by turn: every episode's turn is one `generate` call,
    and `decode_idle_share` (what a continuous batch would save) is still what episodes log."""
    turns = (ROOT / "llmrl" / "engines" / "hf_turns.py").read_text()
    return "decode_idle_share" in _code() and "continuous" not in turns.lower()


def _convention_probe_not_run() -> bool:
    return not (ROOT / "bench" / "results" / "rg-convention.json").exists()


# (file, a phrase of the sentence, the check that holds while it is true)
CLAIMS: list[tuple[str, str, Callable[[], bool]]] = [
    ("docs/architecture.md", "is not built yet", _episodes_refuse_several_processes),
    ("docs/environments.md", "## Not yet built", _turns_are_synchronous),
    ("docs/environments.md", "OpenEnv environments (why not yet", _no_env_adapters),
    ("docs/errors.md", "episodes in several processes (not built yet)", _episodes_refuse_several_processes),
    ("docs/environments.md", "What is *not built*", _episodes_refuse_several_processes),
    ("README.md", "what is not built yet", _episodes_refuse_several_processes),
    ("README.md", "what is not built yet", _no_env_adapters),
    ("docs/engines.md", "on a GPU no figure exists yet", _no_gpu_results),
    ("docs/performance.md", "no GPU has been lent to this project's", _no_gpu_results),
    ("docs/performance.md", "measurements yet", _no_gpu_results),
    ("docs/performance.md", "## Not measured yet", _no_gpu_results),
    ("docs/scaling.md", "not yet run on GPUs", _no_gpu_results),
    ("docs/tasks.md", "that script itself has not been run yet", _convention_probe_not_run),
]

# Sentences with "yet" about a run's or a quantity's state, not about what llmrl has: (file, phrase).
NOT_CLAIMS = [
    ("docs/algorithms.md", "nothing was kept yet"),
    ("docs/architecture.md", "no optimizer step ran yet"),
    ("docs/compare-smollm2.md", "has not yet paid that back"),
    ("docs/compare.md", "no common step boundary yet"),
    ("docs/tasks.md", "did not yet leave the"),  # the past of a measurement, with the issue that changed it
    ("docs/engines.md", "not built."),  # "A static cache ... is not built": the compiled step, not kept
    ("docs/performance.md", "packing the update's products (not built)"),
    ("docs/errors.md", "no actor saved yet"),  # the run's state `llmrl export` refuses
]


def _prose(line: str) -> str:
    """The line without its `code` spans: quoted error messages ("No checkpoint was written yet") are
    what llmrl prints about a run, not claims about llmrl."""
    return re.sub(r"`[^`]*`", "", line)


def _claim_lines() -> list[tuple[str, int, str]]:
    """(file, line number, line) of every "yet" / "not built" in prose of docs/*.md (not history.md) and the README."""
    files = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "history.md")]
    out = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PATTERN.search(_prose(line)):
                out.append((str(path.relative_to(ROOT)), n, line))
    return out


def _listed(file: str, lines: list[str], n: int) -> bool:
    """Whether line n (1-based) of `file`, or its neighbours (a sentence wraps), holds a listed phrase."""
    window = " ".join(lines[max(0, n - 2) : n + 1])
    window = re.sub(r"\s+", " ", window)
    return any(f == file and phrase in window for f, phrase, *_ in [*CLAIMS, *NOT_CLAIMS])


def test_every_yet_sentence_in_the_docs_is_listed_with_a_check() -> None:
    unlisted = []
    for file, n, line in _claim_lines():
        lines = (ROOT / file).read_text().splitlines()
        if not _listed(file, lines, n):
            unlisted.append(f"{file}:{n}: {line.strip()[:160]}")
    assert not unlisted, "list these in tests/test_docs_claims.py (CLAIMS with a check, or NOT_CLAIMS):\n" + "\n".join(unlisted)


@pytest.mark.parametrize(("file", "phrase", "check"), CLAIMS, ids=[f"{f}:{p[:30]}" for f, p, _ in CLAIMS])
def test_each_claim_is_in_its_file_and_still_true(file: str, phrase: str, check: Callable[[], bool]) -> None:
    text = re.sub(r"\s+", " ", (ROOT / file).read_text())
    assert phrase in text, f"{file} no longer says {phrase!r}: drop the claim here"
    assert check(), f"{file} says {phrase!r}, but {check.__name__} no longer holds: make the docs say the present"


def test_the_unlisted_check_finds_a_new_claim() -> None:
    """The first test's reader on a made-up line: a new "not built yet" sentence is found and is not listed."""
    line = "Sharded episodes are not built yet."
    assert PATTERN.search(_prose(line)) and not _listed("docs/new.md", [line], 1)
    assert not PATTERN.search(_prose("`No checkpoint was written yet; fix it`"))
