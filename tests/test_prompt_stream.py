"""The prompt stream (run/data.py): no step reads a train row twice, each epoch is still a
permutation, and the stream is the plain seeded one wherever no step would have repeated a row
(issue 45, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmrl.run.data import PromptSampler
from tests.helpers import cli_refused


def _seeded_stream(n: int, per_step: int, seed: int, steps: int) -> list[list[int]]:
    """The stream before the fix: position k is randperm_e[k mod n] of epoch e = k // n, no swap."""
    perms = {}
    out = []
    for s in range(steps):
        row = []
        for k in range(s * per_step, (s + 1) * per_step):
            e = k // n
            if e not in perms:
                perms[e] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + e)).tolist()
            row.append(perms[e][k % n])
        out.append(row)
    return out


def test_no_step_reads_a_row_twice_and_every_epoch_is_a_permutation() -> None:
    # n = 10, B = 4: every other epoch boundary (10, 30, 50, … mod 4 = 2) cuts a step into 2 rows of the
    # old epoch and 2 of the new one; the plain seeded stream repeats a row in some of those steps
    n, per_step, steps = 10, 4, 60
    sampler = PromptSampler(n, per_step, 0)
    got = [sampler.indices(s).tolist() for s in range(steps)]
    plain = _seeded_stream(n, per_step, 0, steps)
    assert any(len(set(r)) < per_step for r in plain)  # the case exists for these numbers
    assert all(len(set(r)) == per_step for r in got), [r for r in got if len(set(r)) < per_step]
    flat = [x for r in got for x in r]
    for e in range(steps * per_step // n):  # every row once per epoch
        assert sorted(flat[e * n:(e + 1) * n]) == list(range(n))
    # a step that repeated no row is unchanged up to the first one that did
    first = next(i for i, r in enumerate(plain) if len(set(r)) < per_step)
    assert got[:first] == plain[:first]


def test_the_default_runs_stream_changes_only_from_its_first_repeat() -> None:
    """The default run: 9500 arithmetic train rows, B = 512, seed 0, 400 steps. The plain stream read a
    row twice in 18 of its steps (89 repeats in all, the first in step 19); now none does, and steps
    1-18 read exactly what they read before."""
    n, per_step, steps = 9500, 512, 400
    sampler = PromptSampler(n, per_step, 0)
    got = [sampler.indices(s).tolist() for s in range(steps)]
    plain = _seeded_stream(n, per_step, 0, steps)
    repeats = [(s + 1, per_step - len(set(r))) for s, r in enumerate(plain) if len(set(r)) < per_step]
    assert len(repeats) == 18 and sum(d for _, d in repeats) == 89 and repeats[0] == (19, 6)
    assert all(len(set(r)) == per_step for r in got)
    assert got[:18] == plain[:18] and got[18] != plain[18]
    # only the swapped positions differ: step 19 differs from the plain one in 6 of its 512 rows
    assert sum(a != b for a, b in zip(got[18], plain[18])) == 6


def test_a_resumed_sampler_reads_the_same_stream() -> None:
    """A fresh sampler asked for step s (a resumed run) gives what one that walked from step 0 gave."""
    walked = PromptSampler(10, 4, 3)
    stream = [walked.indices(s).tolist() for s in range(40)]
    assert all(PromptSampler(10, 4, 3).indices(s).tolist() == stream[s] for s in (0, 7, 22, 39))


def test_a_step_larger_than_the_train_split_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    cli_refused(["train", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", "numeric",
                 "--out", str(tmp_path / "r"), "--set", "rollout.prompts_per_step=5", "--set", "data.eval_fraction=0",
                 "--set", "update.minibatch_size=5"],
                "rollout.prompts_per_step (5) is larger than the train split (4 rows)")
