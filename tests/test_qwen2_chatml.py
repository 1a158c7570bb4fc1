"""A random Qwen2-architecture model with Qwen2.5's own ChatML template (tests/data), trained a few
steps by `llmrl train` on a reasoning-gym task and in Hermes-format tool episodes (issue 46's CI: no
download). Before the tool run the model is taught, in the test, to write one `<tool_call>` and to
answer after the tool: a random model writes no call, and a run whose calls are never parsed checks
nothing. Asserted: the prompts the template renders (its default system prompt, or data.system_prompt),
the calls parsed from the model's own tokens, and the action mask (model turns trained, the
environment's tokens not). The reasoning-gym runs start from a model taught to answer every
leg_counting question with held-out question 0's answer, in tags under the template's own system
prompt and alone under an empty one, so that their held-out strict and lenient accuracies are known
numbers (not zeros of a random model) that the run's evaluation must reproduce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from llmrl import load_config, train
from llmrl.envs import resolve_env
from llmrl.envs.render import env_turn_ids, prompt_ids
from llmrl.models.prompts import render_prompts
from llmrl.tasks import TASKS, Task, task_from_config

TEMPLATE = (Path(__file__).parent / "data" / "qwen2.5-chat-template.jinja").read_text()
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SMALL = ["rollout.prompts_per_step=2", "rollout.num_generations=2", "update.minibatch_size=4", "eval.size=2",
         "eval.every=0", "checkpoint.every=1", "threads=1", "rollout.temperature=0.3", "log.completions_every=1"]


def chatml_tokenizer() -> Qwen2Tokenizer:
    """Qwen2's own tokenizer class, byte-level as Qwen's is, with one token per byte (no merges), ChatML's
    specials and the Hermes tags as single tokens, and Qwen2.5's chat template. (A tokenizer of another
    class saved beside a Qwen2 config reloads as a Qwen2Tokenizer and reads other ids.)"""
    byte_chars = bytes_to_unicode()
    tok = Qwen2Tokenizer(vocab={byte_chars[i]: i for i in range(256)}, merges=[], unk_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.chat_template = TEMPLATE
    return tok


def taught_qwen2(tok: Qwen2Tokenizer, steps: int = 150) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 (q/k/v biases, untied head) taught by cross-entropy on its two turns of four
    chat_calc_tools episodes: CALL, then after the tool's answer '4'."""
    model = qwen2_of(tok)
    tools = resolve_env("calculator").make().tools()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    text_ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    batch = []
    for row in TASKS["chat_calc_tools"]().train[:4]:
        prompt = prompt_ids(tok, row["prompt"], tools, "hermes")
        turn1, turn2 = text_ids(CALL) + [end], text_ids("4") + [end]
        env = env_turn_ids(tok, [{"role": "tool", "name": "calculator", "content": "4"}], tools, "<|im_end|>")
        ids = prompt + turn1 + env + turn2
        labels = [-100] * len(prompt) + turn1 + [-100] * len(env) + turn2
        batch.append({"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])})
    return teach(model, batch, steps)


def qwen2_of(tok: Qwen2Tokenizer) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 (q/k/v biases, untied head, hidden 64) for `tok` (seed 0)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=2048,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return Qwen2ForCausalLM(cfg)


def teach(model: Qwen2ForCausalLM, batch: list[dict[str, torch.Tensor]], steps: int) -> Qwen2ForCausalLM:
    """`steps` steps of Adam (lr 3e-3) on the cross-entropy of the model's inputs (input_ids, labels, …)
    taken in turn."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        loss = model(**batch[step % len(batch)]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, loss.item()
    return model.eval()


RG_SETS = ["rg.train_size=8", "rg.eval_size=2"]


def rg_task(system_prompt: str | None = None) -> Task:
    """The leg_counting task as the runs below build it (8 train, 2 held-out questions)."""
    extra = [] if system_prompt is None else [f"data.system_prompt={json.dumps(system_prompt)}"]
    return task_from_config(load_config(overrides={"task": "rg:leg_counting"}, sets=[*RG_SETS, *extra]))


def answers(x: str) -> dict[str, str]:
    """What the answering model writes: under the template's default system prompt `<answer>x</answer>`,
    under an empty system prompt `x` alone."""
    return {"default": f"<answer>{x}</answer>", "empty": x}


@pytest.fixture(scope="module")
def answering_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 taught on the 8 train questions, rendered both ways (one batch of 16, right-padded), to
    write `answers(x)` for x = held-out question 0's answer; checked on the held-out questions through
    transformers' own greedy generate."""
    tok = chatml_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    x = rg_task().eval[0]["answer"]
    rows = []
    for name, system in (("default", None), ("empty", "")):
        for row in rg_task(system).train:
            prompt = tok(render_prompts(tok, [row["prompt"]])[0][0], add_special_tokens=False).input_ids
            answer = tok(answers(x)[name], add_special_tokens=False).input_ids + [end]
            rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = lambda seq, value: seq + [value] * (width - len(seq))  # noqa: E731
    batch = {"input_ids": torch.tensor([pad(ids, tok.pad_token_id) for ids, _ in rows]),
             "attention_mask": torch.tensor([pad([1] * len(ids), 0) for ids, _ in rows]),
             "labels": torch.tensor([pad(labels, -100) for _, labels in rows])}
    model = teach(qwen2_of(tok), [batch], steps=100)
    for name, system in (("default", None), ("empty", "")):
        for row in rg_task(system).eval:
            ids = torch.tensor([tok(render_prompts(tok, [row["prompt"]])[0][0], add_special_tokens=False).input_ids])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
            assert tok.decode(out[0, ids.shape[1]:]) == answers(x)[name] + "<|im_end|>", name
    path = tmp_path_factory.mktemp("qwen2-answers") / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen2-chatml") / "model"
    tok = chatml_tokenizer()
    taught_qwen2(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _completions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]


def test_tool_episodes_parse_the_models_hermes_calls_and_train_only_its_turns(chatml_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "calc"
    train(load_config(overrides={"model.name": str(chatml_dir), "out": str(out), "steps": 2, "task": "chat_calc_tools",
                                 "algo": "grpo"},
                      sets=[*SMALL, "rollout.max_new_tokens=72", "rollout.max_turns=2", "rollout.tool_format=hermes"]))
    rows = _completions(out)
    assert len(rows) == 8  # 2 steps × 2 prompts × 2 samples
    tools_prompt = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools"
    called = [r for r in rows if r["tool_calls"] == 1]
    assert len(called) >= 6, [r["turns"][0]["text"] for r in rows]  # sampled at T 0.3 from a taught model
    tok = AutoTokenizer.from_pretrained(chatml_dir)  # as the run loads it
    tools = resolve_env("calculator").make().tools()
    for r in called:
        assert [m["role"] for m in r["prompt"]] == ["user"]  # no system message or worked example of llmrl's
        text = tok.decode(prompt_ids(tok, r["prompt"], tools, "hermes"))
        assert text.startswith(tools_prompt) and '"name": "calculator"' in text  # the template's own, tools= in it
        assert r["tool_errors"] == 0
        by = [(t["by"], t["trained"]) for t in r["turns"]]
        assert by[:3] == [("model", True), ("env", False), ("model", True)]
        assert r["turns"][0]["text"] == CALL + "<|im_end|>"  # the call as sampled, its stop token trained
        assert r["turns"][1]["text"] == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        assert r["turns"][0]["tokens"] == len(CALL) - len("<tool_call></tool_call>") + 2 + 1  # bytes, 2 tags, stop
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # the step's episodes, every one in completions.jsonl: calls per episode, failed calls / calls
        episodes = [r for r in rows if r["step"] == m["step"]]
        calls = sum(r["tool_calls"] for r in episodes)
        assert len(episodes) == 4 and m["tool_calls_per_episode"] == calls / 4 >= 0.5, (m, episodes)
        assert m["tool_error_rate"] == sum(r["tool_errors"] for r in episodes) / calls == 0.0, m


def test_a_reasoning_gym_task_trains_through_the_template_with_a_system_prompt(answering_dir: Path, tmp_path: Path) -> None:
    held_out = rg_task().eval
    x = held_out[0]["answer"]
    share = sum(r["answer"] == x for r in held_out) / len(held_out)  # of the held-out questions the model answers right
    assert share == 0.5  # the two questions' answers differ: a score of the wrong rows shows
    runs = {}
    for name, extra in (("default", []), ("empty", ['data.system_prompt=""'])):
        out = tmp_path / name
        train(load_config(overrides={"model.name": str(answering_dir), "out": str(out), "steps": 1,
                                     "task": "rg:leg_counting", "algo": "grpo"},
                          sets=[*SMALL, "rollout.max_new_tokens=24", *RG_SETS, *extra]))
        runs[name] = _completions(out)
        summary = json.loads((out / "summary.json").read_text())
        # before the update the model writes answers(x)[name] to every held-out question: the tagged answer
        # counts for strict and lenient, the bare one for lenient only; the reward (rg.reward strict) is the
        # strict score, so the accuracy is the strict one
        strict = share if name == "default" else 0.0
        assert (summary["eval_strict_accuracy_before"], summary["eval_lenient_accuracy_before"]) == (strict, share), summary
        assert summary["eval_accuracy_before"] == strict, summary
        assert 0.0 <= summary["eval_strict_accuracy_after"] <= summary["eval_lenient_accuracy_after"] <= 1.0, summary
        assert all(r["completion"] == answers(x)[name] for r in runs[name]), runs[name]  # sampled at T 0.3: as taught
    tok = AutoTokenizer.from_pretrained(answering_dir)  # as the runs load it
    texts = {name: render_prompts(tok, [r["prompt"] for r in rows])[0] for name, rows in runs.items()}
    assert all(t.startswith(QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\n") for t in texts["default"])
    assert all(t.startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n") for t in texts["empty"])
    assert [r["prompt"] for r in runs["empty"]] == [[{"role": "system", "content": ""}, {"role": "user", "content": r["prompt"]}]
                                                     for r in runs["default"]]  # the same questions, the system message first
    assert all("<answer>" in r["prompt"] for r in runs["default"])  # reasoning-gym's tag convention stated


def test_eval_system_prompt_opens_each_held_out_prompt_and_needs_a_template(chatml_dir: Path) -> None:
    """`llmrl eval --system-prompt`: the base is scored on the prompts a run with that data.system_prompt
    trains on (the message first, the question after it); a model without a chat template is refused."""
    from llmrl.errors import ConfigError
    from llmrl.model_eval import load_target, resolve_task

    target = load_target(str(chatml_dir))
    plain = resolve_task("chat_sum", target).eval
    ruled = resolve_task("chat_sum", target, system_prompt="Think briefly.").eval
    assert [r["prompt"] for r in ruled] == [[{"role": "system", "content": "Think briefly."}, *r["prompt"]] for r in plain]
    assert [r["answer"] for r in ruled] == [r["answer"] for r in plain] and plain[0]["prompt"][0]["role"] == "user"
    with pytest.raises(ConfigError, match="'--system-prompt' must be valid UTF-8 text"):  # undecodable command-line bytes
        resolve_task("chat_sum", target, system_prompt="bad \udcff")
    with pytest.raises(ConfigError, match="--system-prompt needs a chat template to render it, and the model tiny has none"):
        resolve_task("arithmetic", load_target("tiny"), system_prompt="Think briefly.")
