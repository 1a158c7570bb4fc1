"""Episodes (step/episodes.py): token in, token out — the ids trained on are the ids sampled, turn by
turn, plus the environment's ids tokenized alone — the action mask, log π_old of the very sequence,
and the episode limits."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from llmrl.config.schema import RolloutConfig
from llmrl.engines.base import Generation, GenerationRequest
from llmrl.engines.hf import HFEngine
from llmrl.envs import EnvSpec, EnvStep, parse_calls, resolve_env
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.step.episodes import EnvFailed, episode_view, generate_episodes, turn_keys
from llmrl.step.forward import masked_logprobs
from llmrl.step.records import check_shapes

from tests.test_prefix import _stack

CPU = torch.device("cpu")
TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>' + m.content + '</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A real BPE tokenizer over printable characters with one merge, '1' '2' → '12', and a
    Qwen-style chat template: a model that samples '1' then '2' wrote ids that re-tokenizing the
    text would merge into one."""
    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars + ["12"])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("1", "2")], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
                                  padding_side="left", additional_special_tokens=SPECIALS[2:])
    tok.chat_template = TEMPLATE
    return tok


def char_ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    """`text` one character per token (never merged), as a model may sample it."""
    return tok.convert_tokens_to_ids(list(text))


@dataclass
class ScriptedEngine:
    """An engine that 'samples' a fixed list of ids per turn for every row, and records its requests."""

    turns: list[list[int]]
    requests: list[GenerationRequest] = field(default_factory=list)
    name: str = "scripted"
    own_weights: bool = False

    def generate(self, request: GenerationRequest) -> Generation:
        ids = self.turns[len(self.requests)]
        self.requests.append(request)
        n = request.prompt_ids.shape[0]
        return Generation(torch.tensor([ids] * n), torch.ones(n, len(ids), dtype=torch.bool))

    def sync(self, stack: Any) -> None: ...

    def stats(self) -> dict[str, float]:
        return {}


def test_the_ids_trained_on_are_the_ids_sampled_turn_by_turn() -> None:
    tok = chat_tokenizer()
    end, open_, close = (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<tool_call>", "</tool_call>"))
    call = '{"name": "calculator", "arguments": {"expression": "12*3"}}'
    turn1 = [open_, *char_ids(tok, call), close, end]  # '1' and '2' sampled apart: the text would merge them
    turn2 = [*char_ids(tok, "36 is 12*3"), end]
    engine = ScriptedEngine([turn1, turn2])
    rows = [{"prompt": "What is 12*3?", "answer": "36"}]
    cfg = RolloutConfig(max_new_tokens=80, max_turns=4, num_generations=2)
    samples = generate_episodes(engine, tok, resolve_env("calculator"), rows, torch.tensor([5]), cfg=cfg, seed=0,
                                step=0, device=CPU, stop_ids=[end])
    check_shapes(samples)
    tools = resolve_env("calculator").make().tools()
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "What is 12*3?"}], tools=tools,
                                         add_generation_prompt=True, tokenize=False), add_special_tokens=False).input_ids
    env = tok("\n<|im_start|>user\n<tool_response>36</tool_response><|im_end|>\n<|im_start|>assistant\n",
              add_special_tokens=False).input_ids
    assert samples.prompt_ids[0].tolist() == prompt
    assert '"name": "calculator"' in tok.decode(prompt)  # the tool's schema, through the template's tools=
    row = samples.response_ids[0][samples.context_mask[0]].tolist()
    assert row == turn1 + env + turn2  # sampled ids as sampled, the env's tokenized alone, concatenated
    assert samples.response_mask[0].tolist() == [True] * len(turn1) + [False] * len(env) + [True] * len(turn2)
    # turn by turn: each turn's request is the row so far, nothing re-tokenized
    first, second = (r.prompt_ids[0][r.prompt_mask[0]].tolist() for r in engine.requests)
    assert first == prompt and second == prompt + turn1 + env
    assert engine.requests[1].keys.tolist() == turn_keys(engine.requests[0].keys, 1).tolist()
    assert engine.requests[0].keys[0] != engine.requests[1].keys[0]
    # the same text re-rendered and re-tokenized is another sequence: the template would re-tokenize differently
    conversation = [{"role": "user", "content": "What is 12*3?"},
                    {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                    {"role": "tool", "content": "36"}, {"role": "assistant", "content": "36 is 12*3"}]
    text = tok.apply_chat_template(conversation, tools=tools, tokenize=False)
    retokenized = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(prompt + row) + "\n" == text  # the same text ...
    assert retokenized[: len(prompt + row)] != prompt + row  # ... but not the same ids
    assert samples.completions == ("36 is 12*3", "36 is 12*3")
    assert samples.episodes is not None and samples.episodes.turns.tolist() == [2, 2]
    assert samples.episodes.tool_calls.tolist() == [1, 1] and samples.episodes.tool_errors.tolist() == [0, 0]
    assert samples.episodes.env_tokens.tolist() == [len(env)] * 2
    view = episode_view(tok, samples, 1)  # completions.jsonl's turn view
    assert [(t["by"], t["trained"], t["tokens"]) for t in view["turns"]] == [
        ("model", True, len(turn1)), ("env", False, len(env)), ("model", True, len(turn2))]
    assert view["turns"][0]["text"] == f"<tool_call>{call}</tool_call><|im_end|>"
    assert view["turns"][1]["text"] == tok.decode(env) and view["tool_calls"] == 1 and view["env_reward"] == 0.0


class Answer:
    """Answers every turn with '7' and never ends the episode."""

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        return EnvStep([{"role": "user", "content": "7"}], reward=0.5)


def _tiny_episodes(budget: int | None = None, env: EnvSpec = EnvSpec("answer", Answer), logprobs: bool = True,
                   context: int | None = None):
    tok = build_char_tokenizer()
    stack = _stack()
    engine = HFEngine(stack, stop_token_ids(tok, stack.lm), tok.pad_token_id)
    cfg = RolloutConfig(max_new_tokens=3, max_turns=3, num_generations=8, max_episode_tokens=budget)
    rows = [{"prompt": "12+3="}, {"prompt": "4+56="}]
    samples = generate_episodes(engine, tok, env, rows, torch.tensor([0, 1]), cfg=cfg, seed=3, step=1, device=CPU,
                                stop_ids=stop_token_ids(tok, stack.lm), logprobs=logprobs, context=context)
    return stack, samples


def test_decoding_logprobs_are_those_of_the_trained_sequence() -> None:
    stack, samples = _tiny_episodes()
    check_shapes(samples)
    env = samples.context_mask & ~samples.response_mask
    assert int(env.sum()) > 0 and samples.episodes is not None and int(samples.episodes.turns.max()) > 1
    assert not (samples.response_mask & ~samples.context_mask).any()
    # the environment sees every turn (0.5 each, summed); its one-token answer only before another turn
    log = samples.episodes
    assert log.env_reward.tolist() == [0.5 * int(t) for t in log.turns]
    assert log.env_tokens.tolist() == env.sum(-1).tolist() and bool((log.env_tokens < log.turns).all())
    with stack.use("actor"):
        full = masked_logprobs(stack, samples, 1.0)  # one forward over prompt + every turn, env tokens attended
    assert samples.behaviour_logprobs is not None and float(full.abs().max()) > 0.5
    torch.testing.assert_close(samples.behaviour_logprobs, full, atol=1e-10, rtol=0)


def test_each_turns_reward_is_kept_at_the_end_of_that_turn() -> None:
    _, samples = _tiny_episodes(logprobs=False)
    log, action = samples.episodes, samples.response_mask
    assert log is not None and log.early_rewards is not None and int(log.turns.max()) > 1
    # Answer gives 0.5 a turn: every turn but the last puts its 0.5 on its own last sampled token, which is
    # a model token followed by an environment token (or the end)
    early = log.early_rewards
    assert early.sum(-1).tolist() == [0.5 * (int(k) - 1) for k in log.turns]
    ends = action & ~torch.cat([action[:, 1:], torch.zeros_like(action[:, :1])], 1)  # a run of model tokens ends
    assert bool(((early != 0) <= ends).all()) and bool((early[~action] == 0).all())
    tok = build_char_tokenizer()
    view = episode_view(tok, samples, int(log.turns.argmax()))
    model = [t for t in view["turns"] if t["by"] == "model"]
    assert [t["reward"] for t in model] == [0.5] * len(model) and view["env_reward"] == 0.5 * len(model)


def test_an_episode_stops_at_its_token_budget() -> None:
    _, samples = _tiny_episodes(budget=5, logprobs=False)
    assert samples.context_mask is not None and int(samples.context_mask.sum(-1).max()) <= 5
    assert samples.behaviour_logprobs is None
    _, samples = _tiny_episodes(context=9, logprobs=False)  # the model's context window bounds it too
    assert int((samples.prompt_mask.sum(-1) + samples.context_mask.sum(-1)).max()) <= 9
    _, unbounded = _tiny_episodes(logprobs=False)
    assert int((unbounded.prompt_mask.sum(-1) + unbounded.context_mask.sum(-1)).max()) > 9


def test_an_environment_that_raises_names_itself_and_the_episode() -> None:
    class Broken(Answer):
        def step(self, text: str, calls: list) -> EnvStep:
            raise KeyError("board")

    class Wrong(Answer):
        def step(self, text: str, calls: list) -> EnvStep:
            return {"reward": 1}  # type: ignore[return-value]

    with pytest.raises(EnvFailed, match=r"Environment 'broken' raised KeyError: 'board' \(episode \d+\)"):
        _tiny_episodes(env=EnvSpec("broken", Broken))
    with pytest.raises(EnvFailed, match=r"Environment 'wrong' returned a dict from step, not an EnvStep"):
        _tiny_episodes(env=EnvSpec("wrong", Wrong))


def test_an_environment_that_hangs_stops_at_its_time_limit() -> None:
    import time

    class Hangs(Answer):
        def step(self, text: str, calls: list) -> EnvStep:
            time.sleep(5)
            return EnvStep(done=True)

    class HangsInReset(Answer):
        def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
            time.sleep(5)
            return []

    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = RolloutConfig(max_new_tokens=8, env_timeout_s=0.2)
    started = time.perf_counter()
    for env, message in [(Hangs, r"Environment 'hangs' took longer than 0.2 s \(episode 0\)\."),
                         (HangsInReset, r"Environment 'slow' took longer than 0.2 s in reset \(episode 0\)\.")]:
        with pytest.raises(EnvFailed, match=message):
            generate_episodes(ScriptedEngine([[*char_ids(tok, "hi"), end]]), tok,
                              EnvSpec("hangs" if env is Hangs else "slow", env), [{"prompt": "x"}], torch.tensor([0]),
                              cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    assert time.perf_counter() - started < 2.0


def test_evaluation_runs_greedy_episodes_with_the_tools() -> None:
    from llmrl.run.evaluate import evaluate_episodes
    from llmrl.tasks.arithmetic import exact_match

    tok = chat_tokenizer()
    end, open_, close = (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<tool_call>", "</tool_call>"))
    call = '{"name": "calculator", "arguments": {"expression": "12*3"}}'
    engine = ScriptedEngine([[open_, *char_ids(tok, call), close, end], [*char_ids(tok, "36"), end]])
    rows = [{"prompt": "What is 12*3?", "answer": "36"}, {"prompt": "What is 12*4?", "answer": "48"}]
    res = evaluate_episodes(engine, tok, resolve_env("calculator"), rows, exact_match, cfg=RolloutConfig(max_new_tokens=80),
                            stop_ids=[end])
    assert res.completions == ["36", "36"] and res.accuracy == 0.5 and res.reward_mean == 0.5
    assert res.metrics["turns_mean"] == 2 and res.metrics["tool_calls_per_episode"] == 1 and res.metrics["eos_rate"] == 1
    assert all(r.keys is None for r in engine.requests)  # greedy turns


def test_a_template_that_cannot_render_the_answer_names_the_environment() -> None:
    tok = chat_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role here') }}"
                         "{% endif %}{{ m.role + ': ' + m.content + '<|im_end|>' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
    end, open_, close = (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<tool_call>", "</tool_call>"))
    call = '{"name": "calculator", "arguments": {"expression": "1+1"}}'
    engine = ScriptedEngine([[open_, *char_ids(tok, call), close, end]])
    with pytest.raises(EnvFailed, match=r"The chat template cannot render the answer of environment 'calculator' "
                                        r"\(TemplateError: no tool role here\) \(episode 0\)\."):
        generate_episodes(engine, tok, resolve_env("calculator"), [{"prompt": "x"}], torch.tensor([0]),
                          cfg=RolloutConfig(max_new_tokens=80), seed=0, step=0, device=CPU, stop_ids=[end])


def test_a_template_without_tools_gets_them_in_a_system_message() -> None:
    """SmolLM2's template ignores `tools=`: the tools and the Hermes call format then come in a system
    message (merged into one the episode opens with); a template that shows tools gets no second copy."""
    from llmrl.envs.calculator import calculator
    from llmrl.envs.render import prompt_ids, template_shows_tools
    from transformers.utils import get_json_schema

    tools = [get_json_schema(calculator)]
    tok = chat_tokenizer()
    assert template_shows_tools(tok)
    shown = tok.decode(prompt_ids(tok, [{"role": "user", "content": "347*28="}], tools))
    assert shown.count('"calculator"') == 1 and "# Tools" not in shown  # the template's own rendering only
    plain = chat_tokenizer()
    plain.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    assert not template_shows_tools(plain)
    text = plain.decode(prompt_ids(plain, [{"role": "user", "content": "347*28="}], tools))
    assert text.startswith("<|im_start|>system\n# Tools\n") and text.endswith("<|im_start|>user\n347*28=<|im_end|>\n"
                                                                             "<|im_start|>assistant\n")
    assert '"name": "calculator"' in text and "<tool_call></tool_call> XML tags" in text
    merged = plain.decode(prompt_ids(plain, [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "347*28="}], tools))
    assert merged.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and merged.count("<|im_start|>system") == 1
    assert plain.decode(prompt_ids(plain, [{"role": "user", "content": "hi"}], None)).startswith("<|im_start|>user")


def test_the_idle_share_counts_the_slots_a_turn_waits_on_its_longest_answer() -> None:
    """Turn 1: answers of 1 and 3 tokens (the batch decodes 3 slots for each of 2 rows), turn 2: 2 and 2.
    slots = 2·3 + 2·2 = 10, the model's tokens 1 + 3 + 2 + 2 = 8: decode_idle_share = 1 − 8/10 = 0.2."""
    from llmrl.step.episodes import episode_stats

    tok = chat_tokenizer()
    end, a = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("a")

    @dataclass
    class Ragged:
        lengths: list[list[int]]
        calls: int = 0
        name: str = "ragged"
        own_weights: bool = False

        def generate(self, request: GenerationRequest) -> Generation:
            lengths = self.lengths[self.calls]
            self.calls += 1
            width = max(lengths)
            ids = torch.tensor([[a] * (k - 1) + [end] + [0] * (width - k) for k in lengths])
            return Generation(ids, torch.tensor([[True] * k + [False] * (width - k) for k in lengths]))

    cfg = RolloutConfig(max_new_tokens=8, max_turns=2, num_generations=1)
    samples = generate_episodes(Ragged([[1, 3], [2, 2]]), tok, EnvSpec("answer", Answer),
                                [{"prompt": "x"}, {"prompt": "y"}], torch.tensor([0, 1]), cfg=cfg, seed=0, step=0,
                                device=CPU, stop_ids=[end])
    assert samples.episodes.decode_slots == 10 and samples.response_mask.sum().item() == 8
    assert episode_stats(samples)["decode_idle_share"] == pytest.approx(0.2, abs=1e-12)


def test_the_plain_call_format_serves_a_chat_model_that_writes_no_json() -> None:
    """rollout.tool_format=plain with a chat template: the tool is explained in a system message (not
    through the template's tools=, whose words would ask for JSON), and a turn ending in '=' calls it."""
    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([[*char_ids(tok, "12*3="), end], [*char_ids(tok, "36"), end]])
    cfg = RolloutConfig(max_new_tokens=20, max_turns=3, num_generations=1, tool_format="plain")
    samples = generate_episodes(engine, tok, resolve_env("calculator"), [{"prompt": "What is 12*3?", "answer": "36"}],
                                torch.tensor([0]), cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    prompt = tok.decode(samples.prompt_ids[0])
    assert prompt.startswith("<|im_start|>system\nYou have a calculator-style tool, calculator: ")
    assert "ending in '=' (for example: 12*34=)" in prompt and "Tools: " not in prompt  # not the template's JSON
    view = episode_view(tok, samples, 0)
    assert [t["by"] for t in view["turns"]] == ["model", "env", "model"] and view["tool_calls"] == 1
    assert "<tool_response>36</tool_response>" in view["turns"][1]["text"] and samples.completions == ("36",)


def test_the_chat_tool_task_shows_a_worked_call_and_is_solved_by_one_call() -> None:
    """`chat_calc`: each conversation opens with the worked example (a plain call '12*34=', the tool's
    408, the answer copied), asks for a·b + c·d, and an episode that writes the whole expression as one
    call and copies the tool's result scores 1 through the task's own reward; the task's plain format
    applies where rollout.tool_format is auto and an explicit setting wins."""
    from llmrl.tasks import TASKS, with_task_format

    task = TASKS["chat_calc"]()
    assert (len(task.train), len(task.eval), task.env, task.tool_format) == (2000, 200, "calculator", "plain")
    assert task.eval == TASKS["chat_calc"]().eval  # fixed, whatever the run's seed
    assert not {r["answer"] + r["prompt"][-1]["content"] for r in task.train} & {
        r["answer"] + r["prompt"][-1]["content"] for r in task.eval}  # disjoint questions
    row = task.eval[0]
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "tool", "assistant", "user"]
    calls = parse_calls(row["prompt"][1]["content"], "plain")
    assert resolve_env("calculator").make().step("12*34=", calls).messages[0]["content"] == "408"
    a, b, c, d = map(int, re.fullmatch(r"What is (\d+)\*(\d+) \+ (\d+)\*(\d+)\?", row["prompt"][-1]["content"]).groups())
    assert 100 <= a <= 999 and 10 <= b <= 99 and 100 <= c <= 999 and 10 <= d <= 99 and row["answer"] == str(a * b + c * d)
    assert with_task_format(RolloutConfig(), task).tool_format == "plain"
    assert with_task_format(RolloutConfig(tool_format="hermes"), task).tool_format == "hermes"
    assert with_task_format(RolloutConfig(), TASKS["calc"]()).tool_format == "auto"

    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([[*char_ids(tok, f"{a}*{b}+{c}*{d}="), end], [*char_ids(tok, row["answer"]), end]])
    cfg = with_task_format(RolloutConfig(max_new_tokens=20, max_turns=3, num_generations=1), task)
    samples = generate_episodes(engine, tok, resolve_env("calculator"), [row], torch.tensor([0]), cfg=cfg, seed=0,
                                step=0, device=CPU, stop_ids=[end])
    assert samples.episodes.tool_calls.tolist() == [1] and samples.episodes.tool_errors.tolist() == [0]
    assert f"<tool_response>{row['answer']}</tool_response>" in tok.decode(samples.response_ids[0])
    assert task.reward([""], list(samples.completions), answer=[row["answer"]]) == [1.0]
    prompt = tok.decode(samples.prompt_ids[0])
    assert prompt.startswith("<|im_start|>system\nYou have a calculator-style tool") and "12*34=" in prompt


def test_the_tools_only_task_offers_the_tool_through_the_template_and_reads_json_calls() -> None:
    """`chat_calc_tools`: chat_calc's questions in the same order with no worked example; the tool's schema
    reaches the prompt through the template's tools= (no system message of llmrl's), and with
    rollout.tool_format json a bare JSON call (what Qwen2.5-Coder-0.5B writes) runs the calculator, while
    hermes reads the same turn as the answer."""
    from llmrl.tasks import TASKS, with_task_format

    task, demo = TASKS["chat_calc_tools"](), TASKS["chat_calc"]()
    assert (len(task.train), len(task.eval), task.env, task.tool_format) == (2000, 200, "calculator", None)
    assert [r["prompt"] for r in task.eval] == [r["prompt"][-1:] for r in demo.eval]  # the same questions, no example
    row = task.eval[0]
    a, b, c, d = map(int, re.fullmatch(r"What is (\d+)\*(\d+) \+ (\d+)\*(\d+)\?", row["prompt"][0]["content"]).groups())
    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = char_ids(tok, '{"name": "calculator", "arguments": {"expression": "%d*%d+%d*%d"}}' % (a, b, c, d))
    by_format = {}
    for fmt in ("json", "hermes"):
        engine = ScriptedEngine([[*call, end], [*char_ids(tok, row["answer"]), end]])
        cfg = with_task_format(RolloutConfig(max_new_tokens=80, max_turns=3, num_generations=1, tool_format=fmt), task)
        by_format[fmt] = generate_episodes(engine, tok, resolve_env("calculator"), [row], torch.tensor([0]), cfg=cfg,
                                           seed=0, step=0, device=CPU, stop_ids=[end])
    json_run, hermes_run = by_format["json"], by_format["hermes"]
    assert json_run.episodes.tool_calls.tolist() == [1] and json_run.episodes.tool_errors.tolist() == [0]
    assert f"<tool_response>{row['answer']}</tool_response>" in tok.decode(json_run.response_ids[0])
    assert task.reward([""], list(json_run.completions), answer=[row["answer"]]) == [1.0]
    assert hermes_run.episodes.tool_calls.tolist() == [0] and hermes_run.episodes.turns.tolist() == [1]
    prompt = tok.decode(json_run.prompt_ids[0])
    assert prompt.startswith("<|im_start|>system\nTools: [") and '"name": "calculator"' in prompt


def test_the_json_example_task_shows_a_call_the_json_format_reads_and_the_tool_answers() -> None:
    """`chat_calc_json`: chat_calc's questions in the same order after a worked example whose call is the
    bare JSON object (calc.JSON_DEMO); under rollout.tool_format auto its episodes read json, the example's
    own call parses to calculator('12*34'), and the environment's result is the example's answer, 408."""
    from llmrl.envs import parse_calls
    from llmrl.tasks import TASKS, calc, with_task_format

    task, plain = TASKS["chat_calc_json"](), TASKS["chat_calc"]()
    assert (len(task.train), len(task.eval), task.env, task.tool_format) == (2000, 200, "calculator", "json")
    assert [r["prompt"][-1] for r in task.eval] == [r["prompt"][-1] for r in plain.eval]
    assert all(r["prompt"][:-1] == calc.JSON_DEMO for r in task.train[:50] + task.eval)
    assert with_task_format(RolloutConfig(), task).tool_format == "json"
    (call,) = parse_calls(calc.JSON_DEMO[1]["content"], "json")
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "12*34"}, None)
    assert parse_calls(calc.JSON_DEMO[1]["content"], "hermes") == []
    from llmrl.envs.calculator import calculator

    assert calculator(**call.arguments) == calc.JSON_DEMO[2]["content"] == calc.JSON_DEMO[3]["content"] == "408"


def test_the_system_prompt_setting_opens_every_prompt_without_one() -> None:
    """data.system_prompt: first in each train and held-out prompt that has no system message (a string
    prompt becomes [system, user]); null leaves the task as it is; '' is an empty system message."""
    from llmrl.config import load_config
    from llmrl.tasks import TASKS, task_from_config, with_system_prompt

    task = TASKS["chat_sum"]()
    assert with_system_prompt(task, None) is task
    ruled = with_system_prompt(task, "Be brief.")
    assert ruled.eval[0]["prompt"] == [{"role": "system", "content": "Be brief."}, *task.eval[0]["prompt"]]
    assert len(ruled.train) == len(task.train) and ruled.train[3]["answer"] == task.train[3]["answer"]
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "q"}]
    assert with_system_prompt(replace(task, eval=[{"prompt": own, "answer": "1"}]), "x").eval[0]["prompt"] == own
    cfg = load_config(overrides={"task": "chat_sum", "data.system_prompt": ""})
    tok = chat_tokenizer()
    first = task_from_config(cfg).eval[0]["prompt"]
    text = tok.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n")


def test_remax_in_episodes_takes_each_rows_greedy_episode_as_its_baseline() -> None:
    """ReMax on episodes (run/draws._episodes): the baseline of a row's G sampled episodes is the score of
    one greedy episode from that row by the actor — its last turn's task reward + the environment's
    rewards (0.5 a turn here) — which is what a greedy evaluation of that row alone scores."""
    from dataclasses import replace
    from types import SimpleNamespace

    from llmrl.config import load_config
    from llmrl.run.draws import _episodes
    from llmrl.run.evaluate import evaluate_episodes
    from llmrl.run.one_step import PhaseClock
    from llmrl.step.records import StepPlan

    tok, stack = build_char_tokenizer(), _stack()
    stop = stop_token_ids(tok, stack.lm)
    engine = HFEngine(stack, stop, tok.pad_token_id)
    config = load_config(None, {}, ["seed=3", "rollout.max_new_tokens=3", "rollout.max_turns=3",
                                    "rollout.num_generations=4"])
    reward = lambda prompts, completions, **_: [float(len(c)) for c in completions]  # noqa: E731  (varies by episode)
    env = EnvSpec("answer", Answer)
    s = SimpleNamespace(config=config, plan=StepPlan(reference=False, critic=False, greedy=True), stack=stack, env=env,
                        engine=engine, tokenizer=tok, task=SimpleNamespace(reward=reward))
    rows = [{"prompt": "12+3="}, {"prompt": "4+56="}]
    samples, scores = _episodes(s, 1, rows, torch.tensor([0, 1]), PhaseClock(CPU))
    one = replace(config.rollout, num_generations=1)
    alone = [evaluate_episodes(engine, tok, env, [row], reward, cfg=one, stop_ids=stop).reward_mean for row in rows]
    assert scores.baseline is not None and scores.baseline.tolist() == pytest.approx(
        [x for x in alone for _ in range(4)], abs=1e-6)
    assert all(x >= 0.5 for x in alone)  # the environment's reward is in it: every episode has a turn
    assert not torch.equal(scores.scores, scores.baseline)  # the sampled episodes score otherwise


class Graded:
    """Turn k of an episode of `length` turns (the row's) is rewarded k + 10·length; the episode ends after `length`."""

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        self.length, self.turn = int(row["length"]), 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        self.turn += 1
        return EnvStep([{"role": "user", "content": "go on"}], reward=self.turn + 10.0 * self.length,
                       done=self.turn == self.length)


def test_each_turns_mean_reward_is_a_step_metric() -> None:
    """Episodes of 1, 3 and 2 turns (max 4): turn 1's mean over all three = 1 + 10·(1+3+2)/3 = 21, turn 2's over
    the two that took it = 2 + 10·(3+2)/2 = 27, turn 3's = 3 + 30 = 33, turn 4: none took it (None)."""
    from llmrl.step.episodes import episode_stats

    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([[*char_ids(tok, "ok"), end]] * 3)
    rows = [{"prompt": "a", "length": 1}, {"prompt": "b", "length": 3}, {"prompt": "c", "length": 2}]
    cfg = RolloutConfig(max_new_tokens=8, max_turns=4, num_generations=1)
    samples = generate_episodes(engine, tok, EnvSpec("graded", Graded), rows, torch.tensor([0, 1, 2]), cfg=cfg, seed=0,
                                step=0, device=CPU, stop_ids=[end])
    assert samples.episodes is not None and samples.episodes.turns.tolist() == [1, 3, 2]
    stats = episode_stats(samples)
    assert stats["env_reward_turn1"] == pytest.approx(21.0, abs=1e-4)
    assert stats["env_reward_turn2"] == pytest.approx(27.0, abs=1e-4)
    assert stats["env_reward_turn3"] == pytest.approx(33.0, abs=1e-4) and stats["env_reward_turn4"] is None
    # the episodes' totals: 11, 3·30 + 1 + 2 + 3 = 96, 2·20 + 1 + 2 = 43
    assert samples.episodes.env_reward.tolist() == [11.0, 96.0, 43.0]


def test_a_turn_that_quotes_its_earlier_call_is_counted() -> None:
    """The json format reads every untagged {"name", "arguments"} object as a call (Qwen2.5-Coder's calls), so an
    answer that quotes the call it made continues the episode unscored; `repeated_call_share` counts such turns.
    Turn 1 calls, turn 2 answers quoting that call (a repeat: the episode goes on), turn 3 answers: per episode
    1 repeated turn of 3, over 2 episodes 2 / 6 = 1/3; a call with other arguments is no repeat."""
    from llmrl.step.episodes import episode_stats

    tok = chat_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = '{"name": "calculator", "arguments": {"expression": "12*3"}}'
    other = '{"name": "calculator", "arguments": {"expression": "12*4"}}'
    turns = [[*char_ids(tok, call), end], [*char_ids(tok, f"36, from {call}"), end], [*char_ids(tok, "36"), end]]
    rows = [{"prompt": "What is 12*3?", "answer": "36"}]
    cfg = RolloutConfig(max_new_tokens=80, max_turns=4, num_generations=2, tool_format="json")
    samples = generate_episodes(ScriptedEngine(turns), tok, resolve_env("calculator"), rows, torch.tensor([5]),
                                cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    assert samples.episodes.turns.tolist() == [3, 3] and samples.episodes.repeated_calls.tolist() == [1, 1]
    assert episode_stats(samples)["repeated_call_share"] == pytest.approx(1 / 3, abs=1e-12)
    turns = [[*char_ids(tok, call), end], [*char_ids(tok, other), end], [*char_ids(tok, "48"), end]]
    fresh = generate_episodes(ScriptedEngine(turns), tok, resolve_env("calculator"), rows, torch.tensor([5]),
                              cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    assert fresh.episodes.turns.tolist() == [3, 3] and episode_stats(fresh)["repeated_call_share"] == 0.0
