"""The update's micro-batch is sized to the memory its activations find (run/update_fit.py): the probe's
bytes a token are those the update's own gradient forward keeps (LoRA dropout active, checkpointing as
set), measured here independently by the bytes torch's CPU allocator still holds after such a forward;
the logits are counted for the micro-batch the fit leads to; and through the real command line a run
whose minibatch does not fit updates in micro-batches of the rows that do (the metrics of the run that
takes the whole minibatch at once, up to float32 rounding), one that cannot hold one row is refused
before its first step, as is update.on_policy_values=on where micro-batches would be needed, and a size
set too large is said in one line. The memory is the one thing set here (`--max-memory`, the run's budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import llmrl.run.session as session
from llmrl.config import load_config
from llmrl.config.schema import LoraConfig
from llmrl.memory.budget import Budget
from llmrl.models.load import device_memory
from llmrl.models.sequences import layout
from llmrl.models.stack import PolicyStack
from llmrl.run import update_fit
from llmrl.run.memory import RoleCost
from llmrl.run.update_fit import SLACK, measure_fit, probe_bytes_per_token
from tests.helpers import CLI_SMALL, cli_refused, cli_run, run_metrics
from tests.qwen2_tiny import HIDDEN, make_qwen2

ARGS = ["train", "--algo", "grpo", "--steps", "2", *CLI_SMALL, "--set", "rollout.num_generations=2",
        "--set", "update.minibatch_size=8"]  # 4 prompts × 2 samples: one minibatch of 8 rows
ROWS, PROMPT, RESPONSE = 4, 16, 32  # the measured forward: 4 rows of 48 tokens, 6× the probe's 32


def _allocated(run: Callable[[], object]) -> int:
    """Bytes torch's CPU allocator holds after `run` more than before it: the sum of the profiler's
    allocation (+) and free (−) records, which see every tensor's memory, however it is kept alive."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")


def _kept(stack: PolicyStack) -> int:
    """Bytes the update's gradient forward of ROWS rows keeps until its backward: the allocator's growth over
    that forward (as step/update.py runs it: the actor's adapter, LoRA dropout active) less the growth of
    the same forward without gradients (its output alone)."""
    ids = torch.randint(3, 60, (ROWS, PROMPT + RESPONSE), generator=torch.Generator().manual_seed(0))
    seq = layout(ids[:, :PROMPT], torch.ones(ROWS, PROMPT, dtype=torch.long), ids[:, PROMPT:],
                 torch.ones(ROWS, RESPONSE, dtype=torch.long))
    outputs = []  # held, so that what the forward keeps is not freed before the count

    def forward(grad: bool) -> None:
        with stack.use("actor"), stack.dropout_active(), torch.set_grad_enabled(grad):
            outputs.append(stack.hidden(seq))

    return _allocated(lambda: forward(True)) - _allocated(lambda: forward(False))


def _stack(layers: int, dtype: torch.dtype = torch.float32, checkpointing: bool = False) -> PolicyStack:
    """The 2-layer Qwen2 test model cut to `layers` decoder layers, LoRA r=4 with dropout 0.1 everywhere."""
    model = make_qwen2(dtype=dtype)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return PolicyStack(model, LoraConfig(r=4, alpha=8.0, dropout=0.1), with_critic=False,
                       activation_checkpointing=checkpointing)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probe_counts_what_the_update_forward_keeps(dtype: torch.dtype) -> None:
    # per token the decoder keeps the same tensors whatever the batch: the probe's bytes a token times the
    # 192 tokens of the measured forward are what the allocator holds after it, up to the few per-forward
    # tensors (rotary tables, the dropout's random state: well under 1 %); dropout's masks and masked
    # copies included (without them the probe counts 40 % less here)
    stack = _stack(2, dtype)
    a = probe_bytes_per_token(stack)
    assert _kept(stack) == pytest.approx(a * ROWS * (PROMPT + RESPONSE), rel=0.01)


def test_under_checkpointing_the_probe_counts_the_inputs_and_one_layers_recompute() -> None:
    # a checkpointed forward keeps each layer's inputs (the allocator sees them, whatever holds them), and its
    # backward recomputes one layer at a time, keeping that layer's saved tensors: those of a plain forward of
    # one layer, the 2-layer model's kept bytes less the 1-layer model's. In float32 a layer's first norm
    # saves the layer's input itself, which the checkpoint already keeps: counted once
    one_layer = _kept(_stack(2)) - _kept(_stack(1))
    inputs = ROWS * (PROMPT + RESPONSE) * HIDDEN * 4
    checkpointed = _stack(2, checkpointing=True)
    a = probe_bytes_per_token(checkpointed)
    assert a * ROWS * (PROMPT + RESPONSE) == pytest.approx(_kept(checkpointed) + one_layer - inputs, rel=0.01)
    assert a < probe_bytes_per_token(_stack(2)) / 1.5  # and it is less than the plain forward keeps


def test_the_logits_are_counted_for_the_micro_batch_the_fit_leads_to() -> None:
    # a chunk of 1 MiB holds 64 positions' float32 logits of the 4096-token vocabulary; the minibatch's 8 rows
    # × 16 response tokens (128) do not fit one, the 2 rows that fit the memory (32) do: each row then keeps
    # its float32 logits and log-softmax (2 · 4 · V bytes a response token) beside the decoder's bytes
    config = load_config(overrides={"algo": "grpo", "rollout.prompts_per_step": 4, "rollout.num_generations": 2,
                                    "update.minibatch_size": 8, "model.logits_chunk_mib": 1.0})
    stack = PolicyStack(make_qwen2(), LoraConfig(r=4, alpha=8.0), with_critic=False)
    a, prompt, response, vocab = probe_bytes_per_token(stack), 16, 16, 4096
    row = (prompt + response) * a + 2 * 4 * vocab * response
    held = [RoleCost("base", 0, 10**6)]
    fit = measure_fit(config, stack, held, 10**6 + int(2.5 * row * SLACK), prompt, response)
    assert fit.per_token == pytest.approx(a + 2 * 4 * vocab * response / (prompt + response))
    assert (fit.rows, fit.minibatch_rows, fit.free) == (2, 8, int(2.5 * row * SLACK))


def _fits(monkeypatch: pytest.MonkeyPatch) -> list[update_fit.UpdateFit]:
    """Record every fit the runs measure (the real measure_fit, called through). The settings the plan chooses
    before loading (memory/choose.py, tested through the CLI in test_memory_choose.py) are left out: it is made
    with an unbounded budget here, since the budgets below are sized to the fit's own accounting after loading
    (what the run holds, no process part), which the plan, counting the process, would refuse."""
    seen: list[update_fit.UpdateFit] = []
    real, choose = update_fit.measure_fit, session.choose

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(session, "measure_fit", spy)
    monkeypatch.setattr(session, "choose", lambda config, budget, *a, **k: choose(config, Budget(2**50, budget.source), *a, **k))
    return seen


def test_a_minibatch_that_does_not_fit_runs_in_the_micro_batches_that_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "roomy")])
    assert code == 0 and "micro_batch_size" not in err, err  # this machine holds 8 tiny rows at once
    fit = seen[-1]
    assert fit.minibatch_rows == 8 and fit.rows >= 8
    # memory for what the run holds and 2.5 rows' activations (with the slack): micro-batches of 2
    limit = device_memory(torch.device("cpu")) - fit.free + int(2.5 * fit.row_bytes * SLACK)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "auto"), "--max-memory", str(limit)])
    assert code == 0, err
    assert "llmrl: update.micro_batch_size set to 2: a row of " in err and "room for 2 of the minibatch's 8 rows" in err
    assert seen[-1].rows == 2
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "set"), "--set", "update.micro_batch_size=2",
                            "--max-memory", str(limit)])
    assert code == 0 and "micro_batch_size" not in err, err
    assert run_metrics(tmp_path / "auto") == run_metrics(tmp_path / "set")  # the fitted size is the one run
    assert "micro_batch_size: null" in (tmp_path / "auto" / "config.yaml").read_text()  # the settings as asked
    # every loss is normalised by the whole minibatch's totals (step/update.py), so the micro-batches of 2
    # reorder float32 sums and nothing else: the metrics of the whole minibatch at once, within float32's
    # bound for a sum of n terms in another order, n·2⁻²⁴ of the terms' magnitude (Higham's γ_n), with n the
    # widest sum here (the MLP's 256) and terms as large as the metrics' (entropies and log-probs over 21
    # tokens: log 21 ≈ 3): 256 · 2⁻²⁴ · 3 ≈ 4.6e-5 (seen: 3e-8). Micro-batches normalised by their own
    # totals instead would log 4× the first step's entropy and gradient norm
    tol = 256 * 2**-24 * 3
    for whole, micro in zip(run_metrics(tmp_path / "roomy"), run_metrics(tmp_path / "auto"), strict=True):
        numbers = {k for k, v in whole.items() if isinstance(v, float)}
        assert {k: v for k, v in micro.items() if k not in numbers} == {k: v for k, v in whole.items() if k not in numbers}
        assert {k: micro[k] for k in numbers} == pytest.approx({k: whole[k] for k in numbers}, rel=0, abs=tol)


def test_on_policy_values_on_is_refused_where_the_update_needs_micro_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # update.on_policy_values=on keeps the critic's graph of the whole step for one update pass; where only
    # 2 of the step's 4 rows fit at once it cannot hold, and the run stops before its first step, in one
    # sentence (not a silent switch to the separate critic forward, which `auto` makes)
    seen = _fits(monkeypatch)
    ppo = ["train", "--algo", "ppo", "--steps", "1", *CLI_SMALL, "--set", "update.on_policy_values=on"]
    assert cli_run([*ppo, "--out", str(tmp_path / "probe")])[0] == 0
    fit = seen[-1]
    limit = device_memory(torch.device("cpu")) - fit.free + int(2.5 * fit.row_bytes * SLACK)
    err = cli_refused([*ppo, "--out", str(tmp_path / "on"), "--max-memory", str(limit)],
                      "'update.on_policy_values' (on) keeps the critic's "
                      "graph of the step's 4 rows for one update pass, but a row of ")
    assert "room for 2 at once; use update.on_policy_values=auto" in err
    assert not (tmp_path / "on" / "config.yaml").exists()


def test_a_size_set_above_what_fits_is_said_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    assert cli_run([*ARGS, "--out", str(tmp_path / "probe"), "--steps", "1"])[0] == 0
    fit = seen[-1]
    limit = device_memory(torch.device("cpu")) - fit.free + int(2.5 * fit.row_bytes * SLACK)
    code, _, err = cli_run([*ARGS, "--out", str(tmp_path / "set"), "--set", "update.micro_batch_size=8",
                            "--max-memory", str(limit)])
    assert code == 0, err
    assert "llmrl: update.micro_batch_size=8 may not fit in memory: " in err and "room for about 2 rows" in err


def test_a_run_that_cannot_update_one_row_is_refused_before_its_first_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fits(monkeypatch)
    assert cli_run([*ARGS, "--out", str(tmp_path / "probe"), "--steps", "1"])[0] == 0
    fit = seen[-1]
    # room for half a row's saved tensors: even one row at a time cannot run
    limit = device_memory(torch.device("cpu")) - fit.free + int(0.5 * fit.row_bytes)
    err = cli_refused([*ARGS, "--out", str(tmp_path / "a"), "--max-memory", str(limit)],
                      "This run cannot update even one row at a time: a row of ")
    assert "update.activation_checkpointing=true keeps only each layer's input" in err
    assert not (tmp_path / "a" / "config.yaml").exists()
