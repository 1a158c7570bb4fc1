"""What user code returns, fuzzed (issue 44): Hypothesis draws the values each kind of plug-in could
hand llmrl — None, bools, huge ints, NaN and ±inf, text, bytes, sets, objects, tensors and arrays of
any shape and dtype, nested lists and dicts — and each is handed to the boundary that receives it:

    reward function      step/score.checked_rewards (2 completions)
    environment reset    step/episodes.generate_episodes (a chat tokenizer, a scripted engine)
    environment step     the same, with an EnvStep of drawn fields (or a drawn value in its place)
    environment tools()  the same, the tools the episode's prompt is rendered with
    tool function        a ToolEnv whose one tool returns the drawn value, in an episode
    estimator            estimators.checked_estimate (a registered estimator returning the value)
    policy loss          losses.check_policy_loss
    reward model         rewards.model.RewardModel.check_logits (a real tiny classifier)
    dataset answer       rewards.builtin.check_answer, then the built-in reward that reads it

Each value either runs (and then what consumes it works: the episode's Samples are built, the
rewards are a finite float32 tensor, the schemas are JSON, …) or is refused with one sentence naming
the plug-in, as a PluginError / ConfigError; anything else is a traceback, counted and failed.
About every other draw is a value the plug-in's contract allows (`valid_or_any`): each of those must
run, never be refused, and each family must run at least `MIN_VALID` of them, so a boundary that
refused everything fails here. Fixed, derandomized budgets (about 15 s in all); the counts are printed
with the other fuzz families.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from llmrl.config.schema import RolloutConfig
from llmrl.envs import EnvSpec, EnvStep, ToolCall, ToolEnv
from llmrl.envs.checks import check_tools
from llmrl.errors import ConfigError, PluginError
from llmrl.estimators import EstimatorInput, EstimatorOutput, EstimatorSpec, Needs, checked_estimate
from llmrl.losses import PolicyLoss, PolicyLossSpec, check_policy_loss
from llmrl.rewards.builtin import BUILTINS, check_answer
from llmrl.step.episodes import generate_episodes
from llmrl.step.score import checked_rewards
from tests.fuzzing import TALLY, count
from tests.test_episodes import ScriptedEngine, char_ids, chat_tokenizer

CPU = torch.device("cpu")
EXAMPLES = 150
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
MIN_VALID = EXAMPLES // 4
"""Valid values each family must have run: `valid_or_any` draws its valid branch for about half of the
150 examples (hypothesis picks one_of's branches about evenly: 50-97 here); a quarter leaves room for
that mix and still fails a family whose valid draws were refused, or never drawn."""


class Opaque:
    """An object a plug-in might return by mistake (no JSON, no number, no shape)."""

    def __repr__(self) -> str:
        return "<Opaque>"


def tensors(max_dims: int = 3) -> st.SearchStrategy[Any]:
    """Tensors and arrays of any small shape and a few dtypes, with NaN and ±inf among the numbers."""
    shape = st.lists(st.integers(0, 4), max_size=max_dims).map(tuple)
    fill = st.sampled_from([0.0, 1.5, -2.0, math.nan, math.inf, -math.inf, 3e38])
    dtype = st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool, torch.float16])

    def make(s: tuple[int, ...], x: float, dt: torch.dtype, numpy: bool) -> Any:
        t = torch.full(s, x if dt.is_floating_point else 1.0).to(dt)
        return t.numpy() if numpy else t

    return st.builds(make, shape, fill, dtype, st.booleans())


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8), st.binary(max_size=4), st.just(Opaque()), st.just({1, 2}),
                    st.sampled_from([np.float32(0.5), np.int64(3), np.bool_(True), np.float64("nan")]))
VALUES = st.recursive(st.one_of(SCALARS, tensors()),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                                              st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), inner,
                                                              max_size=3)),
                      max_leaves=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "tool", "system"]), "content": st.text(max_size=12)})
MESSAGES = st.one_of(st.lists(MESSAGE, max_size=3), VALUES, st.lists(st.one_of(MESSAGE, VALUES), max_size=3))
FINITE = st.floats(-1e30, 1e30)  # finite, within float32's range
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3)),
                    max_leaves=6)


def valid_or_any(valid: SearchStrategy[Any], anything: SearchStrategy[Any]) -> SearchStrategy[tuple[bool, Any]]:
    """(True, a value the plug-in's contract allows: it must run) or (False, any draw: it runs or is refused)."""
    return st.one_of(st.tuples(st.just(True), valid), st.tuples(st.just(False), anything))


def _outcome(family: str, name: str, run: Callable[[], Any], valid: bool = False) -> Any:
    """Run one boundary call and count it: 'ran', 'refused' (a one-line sentence naming `name`; a
    `valid` value refused fails the test), or a traceback (re-raised: the test fails)."""
    try:
        out = run()
    except (PluginError, ConfigError) as exc:
        text = str(exc)
        assert not valid, f"a value the contract allows was refused: {text}"
        assert len(text.splitlines()) == 1 and name in text and text.endswith("."), text
        count(family, "refused")
        return None
    except Exception:
        count(family, "traceback")
        raise
    count(family, "ran")
    if valid:
        TALLY[family]["valid"] += 1
    return out


def _ran_valid_values(family: str, draws: Callable[[], None]) -> None:
    """Run a family's draws (`draws`: a @given function) and require that `MIN_VALID` valid values ran."""
    before = TALLY[family]["valid"] if family in TALLY else 0
    draws()
    ran = TALLY[family]["valid"] - before
    assert ran >= MIN_VALID, f"{family}: {ran} valid values ran of {EXAMPLES} draws, fewer than {MIN_VALID}"


# --- rewards -------------------------------------------------------------------------------------

PAIR = st.lists(st.one_of(FINITE, st.integers(-(2**70), 2**70), st.sampled_from([np.float32(0.5), np.int64(3)])),
                min_size=2, max_size=2)
REWARDS = st.one_of(PAIR, PAIR.map(tuple), PAIR.map(lambda v: np.array([float(x) for x in v])),
                    PAIR.map(lambda v: torch.tensor([float(x) for x in v], dtype=torch.float64)))


def test_reward_function_results() -> None:
    family = "plug-ins: reward function"

    @SETTINGS
    @given(valid_or_any(REWARDS, st.one_of(VALUES, st.lists(st.one_of(st.floats(), SCALARS), min_size=2, max_size=2),
                                           st.lists(st.floats(-1e39, 1e39), min_size=1, max_size=3))))
    def each(draw: tuple[bool, Any]) -> None:
        valid, value = draw
        out = _outcome(family, "rewards.py:f", lambda: checked_rewards("rewards.py:f", value, 2), valid)
        if out is not None:
            assert out.shape == (2,) and out.dtype == torch.float32 and bool(torch.isfinite(out).all())
        if valid:  # the numbers themselves, rounded to float32
            assert torch.equal(out, torch.tensor([float(x) for x in value], dtype=torch.float32))

    _ran_valid_values(family, each)


# --- environments: reset, step, tools(), tool results, in real episodes ---------------------------

TOK = chat_tokenizer()
END = TOK.convert_tokens_to_ids("<|im_end|>")


def _episode(name: str, make: Callable[[], Any], turns: int = 2) -> Any:
    """Two episodes of up to `turns` turns in the environment `make` builds (the engine answers 'ok')."""
    engine = ScriptedEngine([[*char_ids(TOK, "ok"), END]] * turns)
    return generate_episodes(engine, TOK, EnvSpec(name, make), [{"prompt": "hi"}], torch.tensor([0]),
                             cfg=RolloutConfig(max_new_tokens=8, max_turns=turns, num_generations=2),
                             seed=0, step=0, device=CPU, stop_ids=[END])


class _Env:
    """An environment whose reset, step and tools return what the test sets on the class."""

    opening: Any = None
    answer: Any = None
    offered: Any = None

    def reset(self, row: dict[str, Any], seed: int) -> Any:
        return self.opening if self.opening is not None else [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> Any:
        return self.answer if self.answer is not None else EnvStep(done=True)

    def tools(self) -> Any:
        return self.offered


def _env(**fields: Any) -> type:
    return type("Fuzzed", (_Env,), fields)


def _checked_samples(samples: Any) -> None:
    assert samples is None or (samples.n == 2 and bool(torch.isfinite(samples.episodes.env_reward).all()))


def test_environment_reset_results() -> None:
    family = "plug-ins: environment reset"

    @SETTINGS
    @given(valid_or_any(st.lists(MESSAGE, min_size=1, max_size=3), MESSAGES))
    def each(draw: tuple[bool, Any]) -> None:
        valid, opening = draw
        _checked_samples(_outcome(family, "envs.py:E",
                                  lambda: _episode("envs.py:E", _env(opening=opening if opening is not None else 0)), valid))

    _ran_valid_values(family, each)


VALID_STEPS = st.builds(lambda m, r, d, calls, errors: EnvStep(m, r, d, calls, min(calls, errors)),
                        st.lists(MESSAGE, max_size=2), FINITE, st.booleans(), st.integers(0, 3), st.integers(0, 3))
STEPS = st.one_of(
    st.builds(EnvStep, messages=st.lists(MESSAGE, max_size=2), reward=st.floats(), done=st.booleans(),
              tool_calls=st.integers(0, 2), tool_errors=st.integers(0, 2)),
    st.builds(EnvStep, messages=MESSAGES, reward=st.one_of(st.floats(), SCALARS), done=st.one_of(st.booleans(), SCALARS),
              tool_calls=st.one_of(st.integers(-2, 3), SCALARS), tool_errors=st.one_of(st.integers(-2, 3), SCALARS)),
    VALUES.filter(lambda v: v is not None))


def test_environment_step_results() -> None:
    family = "plug-ins: environment step"

    @SETTINGS
    @given(valid_or_any(VALID_STEPS, STEPS))
    def each(draw: tuple[bool, Any]) -> None:
        valid, answer = draw
        _checked_samples(_outcome(family, "envs.py:E", lambda: _episode("envs.py:E", _env(answer=answer)), valid))

    _ran_valid_values(family, each)


def test_rewards_summing_beyond_float32_over_an_episode_are_refused() -> None:
    # two turns of 1.7e38: each within float32's range (≤ 3.4028e38), their sum 3.40282e38 beyond it
    with pytest.raises(PluginError, match=r"^Environment 'envs.py:E' returned rewards that sum to 3.40282e\+38 over the "
                                          r"turns of episode 0 \(turn 2\), beyond the float32 range"):
        _episode("envs.py:E", _env(answer=EnvStep(reward=1.7014117838986683e38)))


NAMES = st.text(min_size=1, max_size=6).filter(lambda s: s.strip() != "")
VALID_SCHEMAS = st.one_of(st.none(), st.lists(st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries({"name": NAMES}, optional={"parameters": st.dictionaries(st.text(max_size=5), JSON,
                                                                                                max_size=3),
                                                                  "description": st.text(max_size=8)})}), max_size=3))
SCHEMAS = st.one_of(
    VALUES,
    st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("function"),
                               "function": st.fixed_dictionaries({"name": st.text(max_size=6)},
                                                                 optional={"parameters": VALUES, "description": VALUES})}),
        VALUES), max_size=3))


def test_environment_tools_results() -> None:
    family = "plug-ins: environment tools()"

    @SETTINGS
    @given(valid_or_any(VALID_SCHEMAS, SCHEMAS))
    def each(draw: tuple[bool, Any]) -> None:
        valid, offered = draw
        out = _outcome(family, "envs.py:E", lambda: check_tools("envs.py:E", offered, before=True), valid)
        if out is not None:
            json.dumps(out)
            _checked_samples(_outcome(family, "envs.py:E", lambda: _episode("envs.py:E", _env(offered=offered)), valid))

    _ran_valid_values(family, each)


def lookup(query: str) -> Any:
    """Look something up.

    Args:
        query: what to look up
    """
    return RESULT[0]


RESULT: list[Any] = [None]


class _Lookup(ToolEnv):
    """A ToolEnv whose every turn calls its one tool (the scripted model writes no call)."""

    def __init__(self) -> None:
        super().__init__([lookup])

    def step(self, text: str, calls: list) -> EnvStep:
        return super().step(text, [ToolCall("lookup", {"query": text})])


def test_tool_function_results() -> None:
    family = "plug-ins: tool function"

    @SETTINGS
    @given(valid_or_any(JSON, VALUES))
    def each(draw: tuple[bool, Any]) -> None:
        valid, RESULT[0] = draw
        samples = _outcome(family, "test_fuzz_plugins:lookup", lambda: _episode("envs.py:Lookup", _Lookup), valid)
        if samples is not None:  # the result reached the episode as a tool message's text
            assert samples.episodes.env_tokens.sum() > 0

    _ran_valid_values(family, each)


# --- estimators and policy losses ----------------------------------------------------------------

N, T = 4, 3
MASK = torch.tensor([[True, True, False]] * N)


def _estimator(value: Any) -> EstimatorOutput:
    return value


FULL = st.builds(lambda x, dt: torch.full((N, T), x, dtype=dt), FINITE, st.sampled_from([torch.float32, torch.float64]))
VALID_ESTIMATES = st.builds(EstimatorOutput, advantages=FULL, returns=FULL,  # returns: a critic's targets, so always
                            stats=st.dictionaries(st.text(max_size=4), st.one_of(FINITE, st.integers()), max_size=2))
ESTIMATES = st.one_of(
    st.builds(EstimatorOutput, advantages=st.one_of(tensors(), VALUES), returns=st.one_of(st.none(), tensors()),
              stats=st.one_of(st.dictionaries(st.text(max_size=4), st.one_of(st.floats(), SCALARS), max_size=2), VALUES)),
    st.builds(lambda x, r: EstimatorOutput(torch.full((N, T), x, dtype=torch.float64), r), st.floats(),  # right shape
              st.one_of(st.none(), st.just(torch.zeros(N, T)), st.just(torch.zeros(N, T + 1)))),
    VALUES)


def test_estimator_outputs() -> None:
    family = "plug-ins: estimator"

    @SETTINGS
    @given(valid_or_any(VALID_ESTIMATES, ESTIMATES), st.booleans())
    def each(draw: tuple[bool, Any], critic: bool) -> None:
        valid, out = draw
        spec = EstimatorSpec("fuzzed", lambda x: _estimator(out), Needs(critic=critic), "R", "none")
        x = EstimatorInput(token_rewards=torch.zeros(N, T), response_mask=MASK, group_size=2,
                           values=torch.zeros(N, T) if critic else None)
        got = _outcome(family, "Estimator 'fuzzed'", lambda: checked_estimate(spec, x), valid)
        if got is not None:
            assert got.advantages.shape == (N, T) and bool(torch.isfinite(got.advantages).all())

    _ran_valid_values(family, each)


def _loss_value(kind: str, x: float, s: tuple[int, ...]) -> Any:
    lp = torch.zeros(N, T, requires_grad=True)
    if kind == "graph":
        return (lp.sum() * 0 + x).reshape(()).expand(s) if s else lp.sum() * 0 + x
    return torch.full(s, x, dtype=torch.float64)


VALID_LOSSES = st.builds(lambda x, c: PolicyLoss(_loss_value("graph", x, ()), c, c), FINITE,
                         st.sampled_from([torch.tensor(0.25), torch.tensor([0.5]), torch.tensor([[0.0]], dtype=torch.float64)]))
LOSSES = st.one_of(
    st.builds(lambda k, x, s, c: PolicyLoss(_loss_value(k, x, s), c, c), st.sampled_from(["graph", "plain"]), st.floats(),
              st.sampled_from([(), (1,), (N, T)]), st.one_of(st.just(torch.tensor(0.25)), tensors(1), SCALARS)),
    st.builds(lambda v: PolicyLoss(v, torch.tensor(0.0), torch.tensor(0.0)), VALUES),
    st.builds(lambda x: PolicyLoss(_loss_value("graph", x, ()), torch.tensor(0.1), torch.tensor(0.0)), st.floats()),
    VALUES)


def test_policy_loss_outputs() -> None:
    family = "plug-ins: policy loss"

    @SETTINGS
    @given(valid_or_any(VALID_LOSSES, LOSSES))
    def each(draw: tuple[bool, Any]) -> None:
        valid, out = draw
        spec = PolicyLossSpec("fuzzed", lambda *a, **k: out, "", "", False)
        lp = torch.zeros(N, T, requires_grad=True)
        zeros = torch.zeros(N, T)
        got = _outcome(family, "Policy loss 'fuzzed'", lambda: check_policy_loss(spec, out, lp, zeros, zeros, MASK), valid)
        if got is not None:
            assert got.loss.ndim == 0 and bool(torch.isfinite(got.loss)) and got.loss.requires_grad
            got.loss.backward()

    _ran_valid_values(family, each)


# --- reward models and dataset answers -----------------------------------------------------------

@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real tiny sequence classifier (2 layers, hidden 32) loaded as llmrl loads a reward model."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from llmrl.models.tokenizer import build_char_tokenizer
    from llmrl.rewards.model import RewardModel

    path = tmp_path_factory.mktemp("rm")
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                               num_labels=1, pad_token_id=tok.pad_token_id)).save_pretrained(path)
    tok.save_pretrained(path)
    return RewardModel(str(path), CPU)


def test_reward_model_logits(reward_model: Any) -> None:
    assert reward_model(["1+1="], ["2"]) and len(reward_model(["1+1=", "2+2="], ["2", "4"])) == 2  # the real path runs

    near = st.builds(lambda rows, labels, x, dt: torch.full((rows, labels), x).to(dt), st.integers(1, 3),
                     st.integers(0, 3), st.floats(-1e3, 1e3), st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
    valid = st.integers(1, 3).flatmap(lambda n: st.tuples(  # (n, L ≥ 1) floating logits for the n texts asked
        st.builds(lambda labels, x, dt: torch.full((n, labels), x).to(dt), st.integers(1, 3), st.floats(-1e3, 1e3),
                  st.sampled_from([torch.float32, torch.bfloat16, torch.float64])), st.just(n)))
    family = "plug-ins: reward model"

    @SETTINGS
    @given(valid_or_any(valid, st.tuples(st.one_of(tensors(), VALUES, near), st.integers(1, 3))))
    def each(draw: tuple[bool, tuple[Any, int]]) -> None:
        ok, (logits, n) = draw
        got = _outcome(family, reward_model.source, lambda: reward_model.check_logits(logits, n), ok)
        if got is not None:
            scores = got[:, 0] if got.shape[-1] == 1 else got.float().softmax(-1)[:, -1]
            assert scores.shape == (n,)

    _ran_valid_values(family, each)


ANSWERS = st.one_of(st.integers(-(10**9), 10**9), st.floats(-1e9, 1e9), st.text(max_size=10).map(lambda s: s + " 7"))


def test_dataset_answer_columns() -> None:
    family = "plug-ins: dataset answer column"

    @SETTINGS
    @given(valid_or_any(ANSWERS, st.one_of(VALUES, st.text(max_size=10), st.integers(), st.floats())),
           st.sampled_from(["exact_match", "numeric", "first_number"]))
    def each(draw: tuple[bool, Any], reader: str) -> None:
        valid, value = draw
        where = "Row 1 of dataset 'd.jsonl'"
        ok = _outcome(family, where, lambda: check_answer(value, "answer", reader, where) or True, valid)
        if ok:  # accepted: the built-in reward that reads it scores a completion against it
            rewards = BUILTINS[reader](["1+1="], ["2"], answer=[value])
            assert len(rewards) == 1 and rewards[0] in (0.0, 1.0)

    _ran_valid_values(family, each)
