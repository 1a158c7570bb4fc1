"""Importance-sampling corrections between the sampler μ and π_old (llmrl/corrections.py): a
hand-computed table per mode, masked positions that never matter, the update with real tiny
models (bit-identical when μ = π_old, a rejected token's contribution removed exactly), the
logged diagnostics (one process and two gloo processes) and the bad-band refusal through the CLI."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from llmrl import load_config
from llmrl.config.load import field_types
from llmrl.corrections import CORRECTIONS, get_correction, register_correction
from llmrl.errors import ConfigError
from llmrl.losses import get_policy_loss
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.parallel.distributed import SINGLE, DistContext
from llmrl.parallel.stats import sampler_mismatch
from llmrl.run.checkpoint import trainable_state
from llmrl.run.reporting import NullReporter
from llmrl.run.one_step import train_step
from llmrl.run.session import resolve_estimator, setup
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.records import StepPlan, TrainRows
from llmrl.step.update import make_optimizers, update
from llmrl.tasks import get_task
from tests.conftest import make_tiny_model
from tests.helpers import CLI_SMALL, cli_refused, close, digit_share, m
from tests.steps import rollout

NAN = math.nan

# ---------------------------------------------------------------------------------------------
# the table: ρ = π_old/μ = [[1.5, 3.0, ·], [·, 1.25, 0.4]] with mask [[T, T, F], [F, T, T]], C = 2,
# band [0.5, 2]. log μ = log 0.5 on kept tokens, log π_old = log(0.5 ρ); masked positions hold garbage.
# ---------------------------------------------------------------------------------------------

MASK = m([[True, True, False], [False, True, True]])
RHO = [[1.5, 3.0, 1.0], [1.0, 1.25, 0.4]]


def _table(garbage_old: float = NAN, garbage_mu: float = 1e4) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π_old, log μ), (2, 3) float32, with garbage at the masked positions."""
    mu = torch.full((2, 3), math.log(0.5))
    old = mu + torch.tensor(RHO).log()
    return old.masked_fill(~MASK, garbage_old), mu.masked_fill(~MASK, garbage_mu)


EXPECTED = {
    # off: 1 on kept tokens, 0 where masked; nothing truncated
    "off": ([[1, 1, 0], [0, 1, 1]], [[0, 0, 0], [0, 0, 0]]),
    # tis: min(ρ, 2) = [[1.5, min(3, 2) = 2, ·], [·, 1.25, 0.4]]; only ρ = 3 is cut
    "tis": ([[1.5, 2.0, 0], [0, 1.25, 0.4]], [[0, 1, 0], [0, 0, 0]]),
    # seq_tis: row 0 Π ρ = 1.5·3 = 4.5 → min(4.5, 2) = 2 (cut); row 1 Π ρ = 1.25·0.4 = 0.5 (kept as is)
    "seq_tis": ([[2.0, 2.0, 0], [0, 0.5, 0.5]], [[1, 1, 0], [0, 0, 0]]),
    # token_mask: 0.5 ≤ ρ ≤ 2 keeps 1.5 and 1.25; rejects 3.0 (> 2) and 0.4 (< 0.5)
    "token_mask": ([[1, 0, 0], [0, 1, 0]], [[0, 1, 0], [0, 0, 1]]),
    # seq_mask: geometric means row 0 √4.5 = 2.1213 > 2 (rejected), row 1 √0.5 = 0.7071 in the band
    "seq_mask": ([[0, 0, 0], [0, 1, 1]], [[1, 1, 0], [0, 0, 0]]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_mode_on_the_hand_computed_table(name: str) -> None:
    old, mu = _table()
    c = get_correction(name)(old, mu, MASK, 2.0, (0.5, 2.0))
    weights, truncated = EXPECTED[name]
    close(c.weights, weights)
    assert c.truncated.tolist() == m(truncated).tolist()
    assert not c.weights.requires_grad and c.weights.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_masked_positions_never_matter(name: str) -> None:
    a = get_correction(name)(*_table(NAN, 1e4), MASK, 2.0, (0.5, 2.0))
    b = get_correction(name)(*_table(-math.inf, -7.0), MASK, 2.0, (0.5, 2.0))
    assert torch.equal(a.weights, b.weights) and torch.equal(a.truncated, b.truncated)
    assert not torch.isnan(a.weights).any()


def test_the_cap_and_the_band_are_the_arguments() -> None:
    old, mu = _table()
    # C = 4: tis keeps 3.0 whole and seq_tis keeps row 0's 4.5 → 4; band [0.3, 3.5] rejects nothing;
    # seq_mask with band [0.75, 2.5]: row 0 √4.5 = 2.1213 ≤ 2.5 kept, row 1 √0.5 = 0.7071 < 0.75 rejected
    close(get_correction("seq_mask")(old, mu, MASK, 2.0, (0.75, 2.5)).weights, [[1, 1, 0], [0, 0, 0]])
    close(get_correction("tis")(old, mu, MASK, 4.0, (0.5, 2.0)).weights, [[1.5, 3.0, 0], [0, 1.25, 0.4]])
    close(get_correction("seq_tis")(old, mu, MASK, 4.0, (0.5, 2.0)).weights, [[4.0, 4.0, 0], [0, 0.5, 0.5]])
    close(get_correction("token_mask")(old, mu, MASK, 2.0, (0.3, 3.5)).weights, [[1, 1, 0], [0, 1, 1]])


def test_a_huge_ratio_is_capped_without_overflow() -> None:
    # Σ log ρ = 200 + 200: exp would be inf in float32; the weight is still C
    mask = m([[True, True]])
    c = get_correction("seq_tis")(torch.tensor([[0.0, 0.0]]), torch.tensor([[-200.0, -200.0]]), mask, 2.0, (0.5, 2.0))
    close(c.weights, [[2.0, 2.0]])


def test_registry_names_are_the_schema_choices_and_unknown_names_list_them() -> None:
    choices = field_types()["update.is_correction"][1].metadata["choices"]
    assert set(choices) == set(CORRECTIONS) == set(EXPECTED)
    with pytest.raises(ConfigError, match="Unknown IS correction 'tiss'; valid IS corrections: off, seq_mask, "
                                          "seq_tis, tis, token_mask."):
        get_correction("tiss")
    with pytest.raises(ValueError, match="already registered"):
        register_correction("tis")(CORRECTIONS["tis"])


# ---------------------------------------------------------------------------------------------
# scaling A by w scales each token's policy-gradient term (the claim of update._actor_loss)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,dual", [("ppo", 3.0), ("ppo", None), ("gspo", None), ("cispo", None)])
def test_weighting_the_advantage_scales_each_tokens_gradient(name: str, dual: float | None) -> None:
    # token ratios spread over both sides of both clip edges, advantages of both signs: for w ≥ 0,
    # ∂L(w·A)/∂log π_θ_t = w_t · ∂L(A)/∂log π_θ_t on every token (token-mean over the same mask)
    gen = torch.Generator().manual_seed(0)
    mask = m([[True, True, True, False], [True, True, True, True]])
    old = torch.randn(2, 4, generator=gen) - 2
    lp = (old + torch.tensor([[0.5, -0.5, 0.1, 9.0], [-0.1, 0.3, -0.4, 0.05]])).requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, -0.5, 0.0], [-1.5, 0.7, 2.0, -1.0]])
    w = torch.tensor([[0.0, 1.7, 0.4, 5.0], [2.0, 0.0, 1.0, 0.3]])
    fn = get_policy_loss(name).fn
    clip = (0.2, 0.28) if name == "ppo" else (0.05, 0.1) if name == "gspo" else (1.0, 0.2)

    def grad(a: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad(fn(lp, old, a, mask, *clip, dual, "token-mean").loss, lp)
        return g

    if name != "gspo":  # gspo's per-token terms share the row's ratio: the per-token identity holds all the same
        assert grad(adv).abs().min() < grad(adv).abs().max()
    torch.testing.assert_close(grad(adv * w), w * grad(adv), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# the update with a real tiny model
# ---------------------------------------------------------------------------------------------


_CACHE: dict[str, tuple] = {}


def _fixture():
    """(stack, initial weights, rows, targets, config): one real GRPO rollout (2 prompts × 4) on a random model."""
    if "grpo" not in _CACHE:
        config = load_config(overrides={"algo": "grpo", "update.lr_actor": 1e-2, "update.minibatch_size": 8,
                                        "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "kl.beta": 0.0})
        spec = resolve_estimator(config)
        torch.manual_seed(0)
        stack = PolicyStack(make_tiny_model(), config.lora, with_critic=False)
        rows = get_task("arithmetic").train[:2]
        plan = StepPlan(reference=False, critic=False, greedy=False)
        r = rollout(stack, build_char_tokenizer(), rows, torch.arange(2), cfg=config.rollout, plan=plan,
                    reward_fn=digit_share, seed=0, step=0)
        targets = estimate(spec, *r, shape_rewards(*r, 0.0, config.kl), config.estimator)
        _CACHE["grpo"] = (stack, trainable_state(stack), r.rows, targets, config)
    return _CACHE["grpo"]


def test_train_rows_carry_mu_only_when_it_is_not_pi_old_itself() -> None:
    stack, _, _, _, config = _fixture()
    rows = get_task("arithmetic").train[:2]
    plan = StepPlan(reference=False, critic=False, greedy=False, from_generation=True)
    r = rollout(stack, build_char_tokenizer(), rows, torch.arange(2), cfg=config.rollout, plan=plan,
                reward_fn=digit_share, seed=0, step=0)
    assert r.forwards.old_logprobs is r.samples.behaviour_logprobs  # the hf engine serves as π_old
    assert r.rows.behaviour_logprobs is None
    other = dataclasses.replace(r.forwards, old_logprobs=r.samples.behaviour_logprobs.clone())
    assert TrainRows.of(r.samples, other).behaviour_logprobs is r.samples.behaviour_logprobs
    assert TrainRows.of(r.samples, dataclasses.replace(r.forwards, old_logprobs=None)).behaviour_logprobs is not None


def _train(rows, targets, correction: str, on_policy: bool = False) -> dict[str, torch.Tensor]:
    """Reset the weights, run one `update` with `update.is_correction = correction`: the weights after."""
    stack, initial, _, _, config = _fixture()
    named = dict(stack.named_parameters())
    with torch.no_grad():
        for name, value in initial.items():
            named[name].copy_(value)
    cfg = dataclasses.replace(config.update, is_correction=correction)
    if on_policy:
        rows = dataclasses.replace(rows, old_logprobs=None)
    update(stack, make_optimizers(stack, cfg), rows, targets, cfg, config.kl, 0.0, config.rollout.temperature,
           torch.Generator().manual_seed(7), on_policy=on_policy)
    return trainable_state(stack)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_tis_with_mu_equal_to_pi_old_is_bit_identical_to_off() -> None:
    _, initial, rows, targets, _ = _fixture()
    assert rows.behaviour_logprobs is None and rows.old_logprobs is not None
    same = dataclasses.replace(rows, behaviour_logprobs=rows.old_logprobs.clone())  # μ = π_old, another tensor
    off = _train(same, targets, "off")
    assert not _same(off, initial)
    assert _same(_train(same, targets, "tis"), off)
    assert _same(_train(rows, targets, "tis"), off)  # no μ: nothing to correct
    # the weights act: μ = π_old − 0.3 (ρ = e^0.3 = 1.35 < C on every token) moves the update
    shifted = dataclasses.replace(rows, behaviour_logprobs=torch.where(rows.response_mask, rows.old_logprobs - 0.3, 0.0))
    assert not _same(_train(shifted, targets, "tis"), off)


def _sgd_step(rows, targets, cfg) -> dict[str, torch.Tensor]:
    """Reset the weights, run one `update` with plain SGD at lr 1 and no gradient clipping: the change
    of every actor parameter is then exactly −(its gradient)."""
    stack, initial, _, _, config = _fixture()
    named = dict(stack.named_parameters())
    with torch.no_grad():
        for name, value in initial.items():
            named[name].copy_(value)
    opts = {"actor": torch.optim.SGD(stack.parameters_of("actor"), lr=1.0)}
    update(stack, opts, rows, targets, cfg, config.kl, 0.0, config.rollout.temperature, torch.Generator().manual_seed(7))
    after = trainable_state(stack)
    return {k: after[k] - initial[k] for k in initial if ".actor" in k}


def _close_all(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], scale: float = 1.0) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k] * scale, atol=1e-6, rtol=0, msg=k)


def test_token_mask_drops_a_rejected_token_from_the_batch() -> None:
    """One token rejected: a token-mean PPO loss over the n − 1 others. With A = 0 at that token instead
    (what zeroing its weight did) the others' terms are the same but divided by n, so the gradient
    with the token dropped is n/(n − 1) times the zeroed one, and not equal to it."""
    _, _, rows, targets, config = _fixture()
    mask, adv = rows.response_mask, targets.advantages
    i, t = [int(x) for x in ((adv != 0) & mask).nonzero()[0]]
    # ρ = e^0.1 = 1.105 (in the band [0.5, 2]) on every token but (i, t), where ρ = e^2 = 7.39
    gap = torch.full_like(rows.old_logprobs, 0.1)
    gap[i, t] = 2.0
    mu = torch.where(mask, rows.old_logprobs - gap, 0.0)
    cfg = dataclasses.replace(config.update, loss_agg="token-mean", max_grad_norm=None)
    dropped = _sgd_step(dataclasses.replace(rows, behaviour_logprobs=mu), targets,
                        dataclasses.replace(cfg, is_correction="token_mask"))
    zeroed = adv.clone()
    zeroed[i, t] = 0.0
    by_hand = _sgd_step(rows, dataclasses.replace(targets, advantages=zeroed), dataclasses.replace(cfg, is_correction="off"))
    n = int(mask.sum())
    assert max(float(d.abs().max()) for d in dropped.values()) > 1e-4  # the update moved the actor
    _close_all(dropped, by_hand, n / (n - 1))
    with pytest.raises(AssertionError):
        _close_all(dropped, by_hand)


@pytest.mark.parametrize("loss", [("ppo", "token-mean"), ("ppo", "seq-mean-token-mean"),
                                  ("gspo", "seq-mean-token-mean"), ("cispo", "seq-mean-token-sum")])
def test_a_row_seq_mask_rejects_trains_exactly_as_the_batch_without_it(loss: tuple[str, str]) -> None:
    """seq_mask rejects row r (geometric-mean ratio e^1.5 = 4.5 > 2): the update's gradient, with an
    entropy bonus too, equals that of the same batch without row r (its token and sequence counts,
    entropy, GSPO's ratio all leave with it)."""
    _, _, rows, targets, config = _fixture()
    mask, adv = rows.response_mask, targets.advantages
    r = int(((adv != 0) & mask).any(-1).nonzero()[0])
    gap = torch.full_like(rows.old_logprobs, 0.1)
    gap[r] = 1.5
    mu = torch.where(mask, rows.old_logprobs - gap, 0.0)
    cfg = dataclasses.replace(config.update, policy_loss=loss[0], loss_agg=loss[1], max_grad_norm=None, ent_coef=0.01,
                              clip_eps=0.2, clip_eps_high=0.2)
    rejected = _sgd_step(dataclasses.replace(rows, behaviour_logprobs=mu), targets,
                         dataclasses.replace(cfg, is_correction="seq_mask"))
    others = torch.tensor([k for k in range(rows.n) if k != r])
    without = _sgd_step(rows.select(others), dataclasses.replace(targets, advantages=adv[others]),
                        dataclasses.replace(cfg, is_correction="off"))
    assert max(float(d.abs().max()) for d in rejected.values()) > 1e-4
    _close_all(rejected, without)


def test_the_on_policy_shortcut_steps_aside_for_a_rejecting_correction_or_dropout_with_vllm(tmp_path: Path) -> None:
    """log π_old from the update's own forward cannot serve a correction that must know the dropped
    tokens before the first micro-batch, nor (with LoRA dropout) one that must compare μ with the
    deterministic π_old: `auto` turns the shortcut off, `on` is refused."""
    from llmrl.config.on_policy import exactly_on_policy

    base = {"algo": "grpo", "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "update.minibatch_size": 8,
            "rollout.engine": "vllm"}
    assert exactly_on_policy(load_config(overrides=base))  # tis without dropout: the update's forward is π_old
    assert exactly_on_policy(load_config(overrides={**base, "rollout.engine": "hf", "update.is_correction": "seq_mask"}))
    for extra in ({"update.is_correction": "seq_mask"}, {"update.is_correction": "token_mask"},
                  {"lora.dropout": 0.1}, {"lora.dropout": 0.1, "update.is_correction": "seq_tis"}):
        assert not exactly_on_policy(load_config(overrides={**base, **extra})), extra
        with pytest.raises(ConfigError, match="needs it from a deterministic forward before the update"):
            load_config(overrides={**base, **extra, "update.on_policy_logprobs": "on"})
    assert exactly_on_policy(load_config(overrides={**base, "lora.dropout": 0.1, "update.is_correction": "off"}))
    _, _, rows, targets, config = _fixture()
    mu = torch.where(rows.response_mask, rows.old_logprobs - 0.1, 0.0)
    with pytest.raises(ValueError, match="drops tokens"):
        _train(dataclasses.replace(rows, behaviour_logprobs=mu), targets, "seq_mask", on_policy=True)


def test_rejecting_corrections_are_the_ones_that_say_which_tokens_stay() -> None:
    from llmrl.config.schema import REJECTING_CORRECTIONS

    ones = torch.ones(2, 3, dtype=torch.bool)
    for name, fn in CORRECTIONS.items():
        assert (fn(torch.zeros(2, 3), torch.zeros(2, 3), ones).kept is not None) == (name in REJECTING_CORRECTIONS), name


# ---------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------

# d = log ρ over the 4 kept tokens = [ln 1.5, ln 3, ln 1.25, ln 0.4] = [0.405465, 1.098612, 0.223144, −0.916291]
#   |d| mean = 2.643512 / 4 = 0.660878, max = ln 3 = 1.098612
#   tis weights [1.5, 2, 1.25, 0.4]: mean 5.15 / 4 = 1.2875, max 2, truncated 1 of 4 = 0.25
#   k3 = (ρ − 1) − d = [0.094535, 0.901388, 0.026856, 0.316291]: mean 1.339070 / 4 = 0.334767
EXPECTED_STATS = {"is_logprob_diff_mean": 0.660878, "is_logprob_diff_max": 1.098612, "is_weight_mean": 1.2875,
                  "is_weight_max": 2.0, "is_truncated_frac": 0.25, "sampler_kl": 0.334767}


def _stats(dist: DistContext, old: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    c = get_correction("tis")(old, mu, mask, 2.0, (0.5, 2.0))
    return sampler_mismatch(dist, old, mu, mask, c.weights, c.truncated)


def test_diagnostics_on_the_hand_made_table() -> None:
    stats = _stats(SINGLE, *_table(), MASK)
    assert stats.keys() == EXPECTED_STATS.keys()
    for key, value in EXPECTED_STATS.items():
        close(torch.tensor(stats[key]), value)
    empty = _stats(SINGLE, *_table(), torch.zeros(2, 3, dtype=torch.bool))
    assert empty == dict.fromkeys(EXPECTED_STATS, 0.0)


def _rank(rank: int, init: str, out: dict) -> None:
    torch_dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        old, mu = _table()
        out[rank] = _stats(DistContext(rank=rank, world_size=2), old[rank:rank + 1], mu[rank:rank + 1], MASK[rank:rank + 1])
    finally:
        torch_dist.destroy_process_group()


def test_two_ranks_reduce_the_diagnostics_to_the_single_process_numbers(tmp_path: Path) -> None:
    # rank 0 holds row 0 (ρ 1.5, 3: the max |d| and the max w), rank 1 row 1: means over 4 tokens, maxima over both
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", out), nprocs=2)
        results = [out[0], out[1]]
    for stats in results:
        for key, value in EXPECTED_STATS.items():
            close(torch.tensor(stats[key]), value)


class _AlwaysBehaviour:
    """The run's own `hf` engine, asked for its decoding log-probs on every request, the way an engine
    whose decoding is not the trainer's (vLLM) reports μ: with rollout.generation_logprobs off, π_old
    comes from a separate actor forward, so μ (the decoding's log-probs) is another tensor."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def generate(self, request):
        return self.engine.generate(dataclasses.replace(request, logprobs=True))

    def sync(self, stack) -> None:
        self.engine.sync(stack)

    def stats(self) -> dict[str, float]:
        return self.engine.stats()


def test_a_step_with_a_behaviour_policy_logs_the_diagnostics(tiny_model_dir: Path, tmp_path: Path) -> None:
    small = {"model.name": str(tiny_model_dir), "rollout.prompts_per_step": 4, "update.minibatch_size": 4,
             "eval.size": 2, "eval.every": 0, "steps": 1, "threads": 1, "rollout.generation_logprobs": False}
    s = setup(load_config(overrides={**small, "out": str(tmp_path / "a")}), NullReporter())
    plain = train_step(s, 0)
    assert not any(k.startswith("is_") or k == "sampler_kl" for k in plain)
    s = setup(load_config(overrides={**small, "out": str(tmp_path / "b")}), NullReporter())
    row = train_step(dataclasses.replace(s, engine=_AlwaysBehaviour(s.engine)), 0)
    # the same float32 policy decoded and re-run: μ ≈ π_old, weights ≈ 1, nothing cut
    assert set(EXPECTED_STATS) <= set(row)
    assert 0 <= row["is_logprob_diff_mean"] <= row["is_logprob_diff_max"] < 1e-4
    assert abs(row["is_weight_mean"] - 1) < 1e-4 and row["is_truncated_frac"] == 0.0
    assert 0 <= row["sampler_kl"] < 1e-6


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


def test_defaults() -> None:
    u = load_config().update
    assert (u.is_correction, u.is_clip, u.is_band) == ("tis", 2.0, [0.5, 2.0])
    assert load_config(sets=["update.is_band=0.3,3"]).update.is_band == [0.3, 3.0]
    assert load_config(sets=["update.is_band=[0.8, 1.25]"]).update.is_band == [0.8, 1.25]


@pytest.mark.parametrize("band", ["1.2,3", "0.5,1", "0,2", "-0.5,2", "0.5", "0.5,2,3"])
def test_a_bad_band_is_refused_in_one_sentence(band: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    err = cli_refused(["train", *CLI_SMALL, "--set", f"update.is_band={band}", "--out", str(out)],
                      "'update.is_band' must be [low, high] with 0 < low < 1 < high")
    assert "got [" in err and not out.exists()


def test_a_cap_below_one_and_a_wrong_name_are_refused(tmp_path: Path) -> None:
    cli_refused(["train", *CLI_SMALL, "--set", "update.is_clip=0.5", "--out", str(tmp_path / "a")],
                "'update.is_clip' must be ≥ 1, got 0.5.")
    cli_refused(["train", *CLI_SMALL, "--set", "update.is_correction=tiss", "--out", str(tmp_path / "b")],
                "'update.is_correction' must be one of off, tis, seq_tis, token_mask, seq_mask; got 'tiss'.")
    cli_refused(["train", *CLI_SMALL, "--set", "update.is_band=a,b", "--out", str(tmp_path / "c")],
                "'update.is_band' must be a list of numbers, got 'a,b'.")
