"""Held-out prompts are never trained on (issue 45, item 4): the guessing games split by range (the
prompt names the range only), and a mixture drops a train row whose prompt any of its tasks holds out."""

from __future__ import annotations

import pytest

from llmrl.errors import ConfigError
from llmrl.tasks import Task, guess, mix_tasks


def _prompts(rows: list[dict]) -> set[str]:
    return {r["prompt"] for r in rows}


@pytest.mark.parametrize("split", [guess.splits, guess.sign_splits])
def test_the_guessing_game_holds_out_whole_ranges(split) -> None:
    """200 held-out games = all ten secrets of 20 ranges; the 700 train games are the other 70 ranges'.
    Before, the split was by (low, secret): every held-out prompt was a train prompt too."""
    train, held_out = split()
    assert len(train) == 700 and len(held_out) == 200
    assert not _prompts(train) & _prompts(held_out)
    lows = {r["low"] for r in held_out}
    assert len(lows) == 20 and all(sum(r["low"] == low for r in held_out) == 10 for low in lows)
    assert {(r["low"], r["answer"]) for r in train} | {(r["low"], r["answer"]) for r in held_out} == {
        (low, str(s)) for low in range(1, 91) for s in range(low, low + 10)}  # every game, once


def test_the_tiny_guess_warm_start_never_shows_a_held_out_prompt() -> None:
    corpus = guess.sign_transcripts()
    assert not {t[0][0] for t in corpus} & _prompts(guess.sign_splits()[1])


def _reward(prompts, completions, **_):
    return [0.0] * len(completions)


def _task(name: str, train: list[str], held_out: list[str]) -> Task:
    return Task(name, [{"prompt": p, "answer": "0"} for p in train], [{"prompt": p, "answer": "0"} for p in held_out],
                _reward)


def test_a_mixture_trains_on_no_question_another_entry_holds_out() -> None:
    """a holds out 'q4', which b trains on; b holds out 'q1', which a trains on: both are dropped from the
    train rows (a: q2, q3 cycled to 3 rows; b: q5 cycled to 2), and the held-out rows stay as they were."""
    a, b = _task("a", ["q1", "q2", "q3"], ["q4"]), _task("b", ["q4", "q5"], ["q1"])
    mixed = mix_tasks([a, b], [3, 2])
    assert [(r["task"], r["prompt"]) for r in mixed.train] == [("a", "q2"), ("a", "q3"), ("a", "q2"),
                                                                ("b", "q5"), ("b", "q5")]
    assert [(r["task"], r["prompt"]) for r in mixed.eval] == [("a", "q4"), ("b", "q1")]


def test_a_mixture_entry_whose_every_question_is_held_out_is_refused() -> None:
    with pytest.raises(ConfigError, match="Every train question of 'b' is held out by another task of the mixture"):
        mix_tasks([_task("a", ["q1", "q2"], ["q4", "q5"]), _task("b", ["q4", "q5"], ["q3"])], [1, 1])
