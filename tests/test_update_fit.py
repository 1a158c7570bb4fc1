"""The update's micro-batch is sized to the memory its activations find (run/update_fit.py): the probe's
bytes a token are those a real gradient forward keeps, and through the real command line a run whose
minibatch does not fit updates in micro-batches of the rows that do (the same metrics as the run that
sets that size itself), one that cannot hold one row is refused before its first step, and a size set
too large is said in one line. The machine's memory is the one thing set here (`device_memory`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import llmrl.run.preflight as preflight
import llmrl.run.session as session
from llmrl.config.schema import LoraConfig
from llmrl.models.sequences import layout
from llmrl.models.stack import PolicyStack
from llmrl.run import update_fit
from llmrl.run.update_fit import PROBE, SLACK, probe_bytes_per_token
from tests.helpers import CLI_SMALL, cli_refused, cli_run, run_metrics
from tests.qwen2_tiny import make_qwen2

ARGS = ["train", "--algo", "grpo", "--steps", "2", *CLI_SMALL, "--set", "rollout.num_generations=2",
        "--set", "update.minibatch_size=8"]  # 4 prompts × 2 samples: one minibatch of 8 rows


def _saved_bytes(stack: PolicyStack, rows: int, prompt: int, response: int) -> int:
    """Bytes of the distinct non-parameter storages the actor's gradient forward of `rows` rows keeps."""
    params = {p.untyped_storage().data_ptr() for p in stack.lm.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t

    ids = torch.randint(3, 60, (rows, prompt + response))
    seq = layout(ids[:, :prompt], torch.ones(rows, prompt, dtype=torch.long), ids[:, prompt:],
                 torch.ones(rows, response, dtype=torch.long))
    with stack.use("actor"), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stack.hidden(seq)
    return sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probe_counts_what_a_larger_forward_keeps(dtype: torch.dtype) -> None:
    # per token the decoder keeps the same tensors whatever the batch: a forward of 4 rows × 48 tokens
    # (4·48 = 6× the probe's 32) keeps 6× the probe's bytes, up to the few per-forward tensors (masks,
    # rotary tables: well under 1 %); a bfloat16 model keeps less per token (its float32 norms excepted)
    stack = PolicyStack(make_qwen2(dtype=dtype), LoraConfig(r=4, alpha=8.0), with_critic=False)
    a = probe_bytes_per_token(stack)
    assert a > 0
    big = _saved_bytes(stack, 4, 16, 32)
    assert abs(big / (4 * 48 * a) - 1) < 0.01, (big, a)
    assert _saved_bytes(stack, 1, PROBE // 2, PROBE // 2) == pytest.approx(a * PROBE, rel=0.01)


def _fits(monkeypatch: pytest.MonkeyPatch) -> list[update_fit.UpdateFit]:
    """Record every fit the runs measure (the real measure_fit, called through)."""
    seen: list[update_fit.UpdateFit] = []
    real = update_fit.measure_fit

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(session, "measure_fit", spy)
    return seen


def test_a_minibatch_that_does_not_fit_runs_in_the_micro_batches_that_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "roomy")])
    assert code == 0 and "micro_batch_size" not in err, err  # this machine holds 8 tiny rows at once
    fit = seen[-1]
    assert fit.minibatch_rows == 8 and fit.rows >= 8
    # memory for what the run holds and 2.5 rows' activations (with the slack): micro-batches of 2
    limit = preflight.device_memory(torch.device("cpu")) - fit.free + int(2.5 * fit.row_bytes * SLACK)
    monkeypatch.setattr(preflight, "device_memory", lambda device: limit)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "auto")])
    assert code == 0, err
    assert "llmrl: update.micro_batch_size set to 2: a row of " in err and "room for 2 of the minibatch's 8 rows" in err
    assert seen[-1].rows == 2
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "set"), "--set", "update.micro_batch_size=2"])
    assert code == 0 and "micro_batch_size" not in err, err
    assert run_metrics(tmp_path / "auto") == run_metrics(tmp_path / "set")
    assert "micro_batch_size: null" in (tmp_path / "auto" / "config.yaml").read_text()  # the settings as asked


def test_a_size_set_above_what_fits_is_said_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    assert cli_run([*ARGS, "--out", str(tmp_path / "probe"), "--steps", "1"])[0] == 0
    fit = seen[-1]
    limit = preflight.device_memory(torch.device("cpu")) - fit.free + int(2.5 * fit.row_bytes * SLACK)
    monkeypatch.setattr(preflight, "device_memory", lambda device: limit)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "set"), "--set", "update.micro_batch_size=8"])
    assert code == 0, err
    assert "llmrl: update.micro_batch_size=8 may not fit in memory: " in err and "room for about 2 rows" in err


def test_a_run_that_cannot_update_one_row_is_refused_before_its_first_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    assert cli_run([*ARGS, "--out", str(tmp_path / "probe"), "--steps", "1"])[0] == 0
    fit = seen[-1]
    # room for half a row's saved tensors: even one row at a time cannot run
    limit = preflight.device_memory(torch.device("cpu")) - fit.free + int(0.5 * fit.row_bytes)
    monkeypatch.setattr(preflight, "device_memory", lambda device: limit)
    err = cli_refused([*ARGS, "--out", str(tmp_path / "a")], "This run cannot update even one row at a time: a row of ")
    assert "update.activation_checkpointing=true keeps only each layer's input" in err
    assert not (tmp_path / "a" / "config.yaml").exists()
