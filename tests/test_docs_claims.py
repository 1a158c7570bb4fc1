"""The docs' sentences about what is not built or not measured *yet* (issue 59, item 10), checked against
the code: docs say the present, so each such claim is listed here with a check that holds while the
claim is true. A new "yet" / "not built" sentence in docs/ or the README fails the first test until it is
listed (as a claim with its check, or as a sentence about a run's state, not the project's); building
what a claim says is missing fails its check, until the docs say the new present.

docs/history.md is the past by design and is not read.

Each check runs what its claim is about (issue 69, item 11): episodes under two processes are refused by
the function that builds the run's environment; an environment named for verifiers or OpenEnv resolves to
none; an episode batch played by the `hf` engine on the tiny model answers every episode's turn only
after the whole turn decoded. The GPU and convention-probe claims are about what the repository holds
(no GPU result, no probe result): their checks read bench/results, the thing those claims describe."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATTERN = re.compile(r"\byet\b|\bnot built\b", re.IGNORECASE)


def _no_gpu_results() -> bool:
    """No result in bench/results came from a GPU (bench/gpu_table.sh writes results-vs-trl-*/roofline-* files
    whose `device` names CUDA; any file named for a GPU or CUDA counts too)."""
    names = [p.name.lower() for p in (ROOT / "bench" / "results").iterdir()]
    texts = [p.read_text(errors="replace") for p in (ROOT / "bench" / "results").glob("*.json")]
    return not any("gpu" in n or "cuda" in n for n in names) and not any('"cuda' in t.lower() for t in texts)


def _episodes_refuse_several_processes() -> bool:
    """`episode_env`, which gives a run its environment, refuses the calc task's episodes in one of two
    processes (and gives them in one)."""
    from dataclasses import replace

    from llmrl.config import load_config
    from llmrl.errors import ConfigError
    from llmrl.parallel.distributed import SINGLE
    from llmrl.run.session import episode_env
    from llmrl.tasks import TASKS

    config = load_config(None, {}, ["task=calc"])
    assert episode_env(config, TASKS["calc"]()) is not None
    try:
        episode_env(config, TASKS["calc"](), replace(SINGLE, world_size=2))
    except ConfigError:
        return True
    return False


def _no_env_adapters() -> bool:
    """An environment named for verifiers or OpenEnv, the way `ta:ENV_ID` names a TextArena game, is
    refused (one sentence): no adapter resolves it."""
    from llmrl.envs import resolve_env
    from llmrl.errors import ConfigError

    for name in ("verifiers:wordle", "vf:wordle", "openenv:echo_env", "oe:echo_env"):
        try:
            resolve_env(name)
        except ConfigError:
            continue
        return False
    return True


def _turns_are_synchronous() -> bool:
    """Three episodes of up to 3 turns on the tiny model through the `hf` engine, answers ending on 0-4 too
    (so their lengths differ): every episode's turn t is answered by its environment before any episode's
    turn t + 1 (the environment waits for the turn's longest answer), and `decode_idle_share` > 0 (the
    finished rows' waiting, what a continuous batch would save)."""
    import torch

    from llmrl.config.schema import LoraConfig, RolloutConfig
    from llmrl.engines.hf import HFEngine
    from llmrl.envs import EnvSpec, EnvStep
    from llmrl.models.stack import PolicyStack
    from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
    from llmrl.step.episodes import episode_stats, generate_episodes
    from tests.conftest import make_tiny_model

    answered: list[int] = []  # the turn of each environment answer, in the order they came

    class Counting:
        def reset(self, row: dict, seed: int) -> list[dict]:
            self.turn = 0
            return [{"role": "user", "content": row["prompt"]}]

        def step(self, text: str, calls: list) -> EnvStep:
            answered.append(self.turn)
            self.turn += 1
            return EnvStep([{"role": "user", "content": "7"}], done=self.turn >= 3)

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    stop = stop_token_ids(tok, make_tiny_model()) + tok.convert_tokens_to_ids(list("01234"))
    engine = HFEngine(PolicyStack(make_tiny_model(), LoraConfig(r=4), with_critic=False), stop, tok.pad_token_id)
    cfg = RolloutConfig(max_new_tokens=4, max_turns=3, num_generations=1, temperature=1.0)
    rows = [{"prompt": p} for p in ("12+3=", "4+56=", "7*8=")]
    samples = generate_episodes(engine, tok, EnvSpec("counting", Counting), rows, torch.arange(3), cfg=cfg, seed=5,
                                step=0, device=torch.device("cpu"), stop_ids=stop)
    several = [turn for turn in set(answered) if answered.count(turn) > 1]  # turns that several episodes played
    return answered == sorted(answered) and len(several) >= 2 and episode_stats(samples)["decode_idle_share"] > 0


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
