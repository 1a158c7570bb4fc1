"""The reward model as llmrl trains and uses it: a LoRA adapter + score head on the base (models/scorer.py),
`llmrl reward train` (reward_model/train.py), and the fourth role of an RL run's stack (run/reward_role.py).

Everything runs on the random 2-layer Llama of conftest.py, through real peft, real files and the real CLI.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from llmrl.config.reward_run import load_reward_config
from llmrl.models.load import load_base
from llmrl.models.scorer import RewardScorer, last_token, read_reward_adapter, tokenized
from llmrl.reward_model.train import train_reward

from .helpers import kill_9_after, run_metrics

LLMRL = [sys.executable, "-m", "llmrl"]


def write_pairs(path: Path, n: int = 64, seed: int = 0) -> Path:
    """Sums `a+b=` with the right answer chosen and a wrong one rejected, the right one followed by '=0', the
    wrong one by '=1' (the char tokenizer knows digits, '+' and '=': a signal the 2-layer random model can
    learn in a few dozen steps)."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            a, b = rng.randrange(50), rng.randrange(50)
            fh.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": f"{a + b}=0", "rejected": f"{a + b + rng.randrange(1, 9)}=1"}) + "\n")
    return path


def reward_config(model: Path, data: Path, out: Path, *sets: str):
    return load_reward_config(overrides={"model.name": str(model), "pairs.dataset": str(data), "out": str(out)},
                              sets=["rm.batch_size=8", "rm.lr=5e-3", "rm.epochs=3", "rm.eval_every=8", "lora.r=4",
                                    "checkpoint.every=4", *sets])


@pytest.fixture(scope="module")
def reward_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("reward")
    out = tmp / "run"
    train_reward(reward_config(tiny_model_dir, write_pairs(tmp / "pairs.jsonl"), out), show_progress=False)
    return out


def test_last_token_is_transformers_rule() -> None:
    # rows right-padded with pad 0: the rightmost non-pad index; a row of pads gives 0 (argmax of zeros)
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9], [0, 0, 0, 0, 0], [4, 0, 3, 0, 0]])
    assert last_token(ids, 0).tolist() == [2, 4, 0, 2]
    assert last_token(ids, None).tolist() == [4, 4, 4, 4]


def test_reward_run_learns_and_writes_its_folder(reward_run: Path) -> None:
    summary = json.loads((reward_run / "summary.json").read_text())
    assert summary["kind"] == "reward-model" and summary["steps"] == 22  # ⌈3 · 58 / 8⌉ with 6 of 64 held out
    # the random head may rank the marker either way at the start; training must make it right and sure
    assert summary["eval_accuracy_after"] == 1.0, summary
    assert summary["eval_margin_after"] > summary["eval_margin_before"] + 1.0, summary
    assert summary["eval_loss_after"] < 0.5 * summary["eval_loss_before"], summary
    for name in ("config.yaml", "metrics.jsonl", "curves.png", "reward.json", "adapter/adapter_config.json",
                 "adapter/adapter_model.safetensors"):
        assert (reward_run / name).is_file(), name
    adapter = json.loads((reward_run / "adapter/adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]


def test_llmrl_scores_equal_plain_peft_sequence_classifier(reward_run: Path, tiny_model_dir: Path) -> None:
    """The saved adapter read by plain peft onto AutoModelForSequenceClassification scores as llmrl's scorer:
    the same float32 sums, so |Δ| ≤ 1e-5 (a few ulps of scores of size ~1)."""
    texts = ["12+3=15=0", "40+40=81=1", "7+7=14=0"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base, tokenizer = load_base(load_reward_config(overrides={"model.name": str(tiny_model_dir)}).model, False)
    scorer = RewardScorer(base, load_reward_config().lora, 0, read_reward_adapter(reward_run / "adapter"))
    ids, mask = tokenized(tokenizer, texts, torch.device("cpu"))
    ours = scorer(ids, mask, tokenizer.pad_token_id)
    classifier = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    classifier.config.pad_token_id = tok.pad_token_id
    plain = PeftModel.from_pretrained(classifier, str(reward_run / "adapter")).eval()
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = plain(**enc).logits[:, 0]
    torch.testing.assert_close(ours.detach(), theirs, atol=1e-5, rtol=0)


def test_training_moves_only_the_reward_adapter_and_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    from llmrl.reward_model.train import step_pairs, update
    from llmrl.tasks.preferences import load_pairs

    config = reward_config(tiny_model_dir, write_pairs(tmp_path / "p.jsonl", 16), tmp_path / "r")
    base, tokenizer = load_base(config.model, False)
    scorer = RewardScorer(base, config.lora, 0)
    before = {n: p.detach().clone() for n, p in scorer.named_parameters()}
    train, _ = load_pairs(config.pairs, tokenizer)
    opt = torch.optim.AdamW(scorer.parameters_of("reward"), lr=1e-2)
    update(scorer, tokenizer, step_pairs(train, 0, 0, 8), opt, config)
    update(scorer, tokenizer, step_pairs(train, 0, 1, 8), opt, config)
    trained = {id(p) for p in scorer.parameters_of("reward")}
    for name, p in scorer.named_parameters():
        moved = not torch.equal(before[name], p.detach())
        if id(p) in trained and ("lora_B" in name or name.startswith("head")):
            assert moved, name
        elif id(p) not in trained:
            assert not moved and p.grad is None, name


def test_kill_9_and_resume_repeat_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write_pairs(tmp_path / "pairs.jsonl", 160)
    sets = ["--set", "rm.batch_size=8", "--set", "rm.epochs=4", "--set", "checkpoint.every=5", "--set", "lora.r=4",
            "--set", "rm.eval_every=0"]
    env = {**os.environ, "LLMRL_CACHE_DIR": str(tmp_path / "cache")}
    common = [*LLMRL, "reward", "train", "--model", str(tiny_model_dir), "--data", str(data), *sets]
    subprocess.run([*common, "--out", str(tmp_path / "full")], env=env, check=True, capture_output=True)
    kill_9_after([*common, "--out", str(tmp_path / "killed")], env, tmp_path / "killed", rows=12)
    assert not (tmp_path / "killed" / "summary.json").exists()
    done = subprocess.run([*LLMRL, "reward", "train", "--resume", str(tmp_path / "killed")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert run_metrics(tmp_path / "killed") == run_metrics(tmp_path / "full")
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "full/adapter/adapter_model.safetensors"))
    b = load_file(str(tmp_path / "killed/adapter/adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rl_run_scores_on_the_shared_base_and_never_trains_the_reward(reward_run: Path, tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    """PPO with the reward run as its only reward: the fourth role is said, the reward adapter and head are
    never updated, and the stack's other roles give the same outputs around a reward forward."""
    from llmrl.config import load_config
    from llmrl.run.session import setup
    from llmrl.run.reporting import NullReporter

    config = load_config(overrides={"model.name": str(tiny_model_dir), "out": str(tmp_path / "rl"), "steps": 1},
                         sets=[f"reward.functions=[{{model: {reward_run}}}]", "rollout.prompts_per_step=4",
                               "rollout.max_new_tokens=4", "eval.size=0", "lora.r=4"])
    session = setup(config, NullReporter())
    stack = session.stack
    assert stack.reward_head is not None
    frozen = {n: p.detach().clone() for n, p in stack.peft.named_parameters() if ".reward." in n or n.endswith(".reward")}
    assert frozen and not any(p.requires_grad for n, p in stack.peft.named_parameters() if n in frozen)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        actor = stack.lm(input_ids=ids).logits
        scored = session.task.reward(["1+2="], ["3=0"])
        again = stack.lm(input_ids=ids).logits
        with stack.use("reference"):
            ref = stack.lm(input_ids=ids).logits
    assert torch.equal(actor, again) and stack.role == "actor"
    assert len(scored) == 1 and scored[0] == pytest.approx(float(scored[0]))
    saved = read_reward_adapter(reward_run / "adapter")
    torch.testing.assert_close(stack.reward_head.weight.detach(), saved.head.float(), atol=0, rtol=0)
    torch.testing.assert_close(actor, ref, atol=0, rtol=0)  # the actor starts as the base (LoRA B = 0)
    with torch.no_grad(), stack.use("reward"):
        assert not torch.equal(stack.lm(input_ids=ids).logits, ref)  # the reward adapter does change the base
    session.folder.path.joinpath(".lock").unlink(missing_ok=True)


def test_train_reward_cli_says_the_fourth_role(reward_run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LLMRL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([*LLMRL, "train", "--model", str(tiny_model_dir), "--reward", str(reward_run), "--steps", "2",
                           "--out", str(tmp_path / "rl"), "--set", "rollout.prompts_per_step=4", "--set",
                           "rollout.max_new_tokens=4", "--set", "eval.size=8", "--set", "eval.every=1",
                           "--set", "lora.r=4", "--set", "kl.beta=0.05"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fourth role" in done.stderr
    assert "reward LoRA adapter + score head (frozen)" in done.stdout  # the start-up memory table's row
    rows = [json.loads(line) for line in (tmp_path / "rl/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(f"reward/model:{reward_run.name}" in r for r in rows)
    # the task's verifier stays the gold metric beside the reward model's mean score (the proxy)
    assert {"eval_gold_accuracy", "eval_reward"} <= rows[0].keys()
    from llmrl.run.folder import read_run
    from llmrl.run.plots import gold_proxy

    kl, gold, proxy = gold_proxy(read_run(tmp_path / "rl"))
    assert len(kl) == 3 and kl[0] == 0 and kl[1] == rows[0]["kl"] and gold[1] == rows[0]["eval_gold_accuracy"]
    assert proxy[1] == rows[0]["eval_reward"] and (tmp_path / "rl/curves.png").is_file()
    from llmrl.model_eval import eval_model  # `llmrl eval` of the run: its reward run scores, as a classifier

    report = eval_model(str(tmp_path / "rl"), size=8, samples=0)
    assert report["greedy"]["reward_mean"] == pytest.approx(proxy[-1], abs=1e-5)  # the run's own last evaluation


def test_critic_starts_from_the_reward_model(reward_run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from llmrl.config import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.run.session import setup

    config = load_config(overrides={"model.name": str(tiny_model_dir), "out": str(tmp_path / "rl"), "steps": 1},
                         sets=[f"reward.functions=[{{model: {reward_run}}}]", "lora.critic_from_reward=true",
                               "eval.size=0", "lora.r=4"])
    stack = setup(config, NullReporter()).stack
    saved = read_reward_adapter(reward_run / "adapter")
    torch.testing.assert_close(stack.value_head.weight.detach(), saved.head.float(), atol=0, rtol=0)
    critic = {n: p for n, p in stack.peft.named_parameters() if ".critic." in n}
    reward = {n.replace(".critic.", ".reward."): p for n, p in critic.items()}
    named = dict(stack.peft.named_parameters())
    assert critic and all(torch.equal(p, named[n]) for n, p in reward.items())
    with pytest.raises(Exception, match="critic_layers"):
        setup(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(tmp_path / "rl2")},
                          sets=[f"reward.functions=[{{model: {reward_run}}}]", "lora.critic_from_reward=true",
                                "lora.critic_layers=1"]), NullReporter())


def test_a_reward_run_on_another_base_is_a_separate_classifier(reward_run: Path, tiny_model_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An RL run on another base (another folder, other weights) scores with the reward run's own base, loaded
    as a sequence classifier with the adapter merged: the same scores as llmrl's scorer on that base (float32
    sums in another order: |Δ| ≤ 1e-5), no fourth role on the actor's stack."""
    from tests.conftest import make_tiny_model
    from llmrl.config import load_config
    from llmrl.models.tokenizer import build_char_tokenizer
    from llmrl.run.reporting import NullReporter
    from llmrl.run.session import setup

    other = tmp_path / "other-base"
    make_tiny_model(seed=1).save_pretrained(other)
    build_char_tokenizer().save_pretrained(other)
    config = load_config(overrides={"model.name": str(other), "out": str(tmp_path / "rl"), "steps": 1},
                         sets=[f"reward.functions=[{{model: {reward_run}}}]", "eval.size=0", "lora.r=4"])
    session = setup(config, NullReporter())
    assert session.stack.reward_head is None and "separate classifier" in capsys.readouterr().err
    prompts, completions = ["12+3=", "40+40="], ["15=0", "81=1"]
    theirs = torch.tensor(session.task.reward(prompts, completions))
    base, tokenizer = load_base(load_reward_config(overrides={"model.name": str(tiny_model_dir)}).model, False)
    scorer = RewardScorer(base, load_reward_config().lora, 0, read_reward_adapter(reward_run / "adapter"))
    ids, mask = tokenized(tokenizer, [p + c for p, c in zip(prompts, completions)], torch.device("cpu"))
    torch.testing.assert_close(theirs, scorer(ids, mask, tokenizer.pad_token_id).detach(), atol=1e-5, rtol=0)


def test_conversational_trl_pairs_end_to_end(tmp_path: Path) -> None:
    """TRL's conversational preference format (prompt messages, chosen/rejected assistant messages) through
    `llmrl reward train` on a model with a chat template, then scored in an RL run's way: the text of
    (prompt messages, completion) is the training pair's text, and the reward run ranks the pairs it learned."""
    from tests.conftest import make_tiny_model
    from llmrl.models.prompts import reward_text
    from llmrl.models.tokenizer import build_char_tokenizer
    from llmrl.tasks.preferences import load_pairs

    model = tmp_path / "chat-model"
    make_tiny_model().save_pretrained(model)
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"
    tok.save_pretrained(model)
    rng = random.Random(0)
    with (tmp_path / "chat.jsonl").open("w") as fh:
        for _ in range(64):
            a, b = rng.randrange(50), rng.randrange(50)
            fh.write(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{b}"}],
                                 "chosen": [{"role": "assistant", "content": f"{a + b}=0"}],
                                 "rejected": [{"role": "assistant", "content": f"{a + b + 1}=1"}]}) + "\n")
    config = reward_config(model, tmp_path / "chat.jsonl", tmp_path / "rm")
    result = train_reward(config, show_progress=False)
    assert result.after["eval_accuracy"] == 1.0 and result.after["eval_loss"] < 0.5 * result.before["eval_loss"]
    base, tokenizer = load_base(config.model, False)
    train, _ = load_pairs(config.pairs, tokenizer)
    first = json.loads((tmp_path / "chat.jsonl").read_text().splitlines()[0])
    text = reward_text(tokenizer, first["prompt"], first["chosen"][0]["content"])
    assert text in {p.chosen for p in train} | {p.chosen for p in load_pairs(config.pairs, tokenizer)[1]}
    assert text.startswith("(") and text.endswith("=0)")


def test_sigterm_stops_at_a_step_with_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The first SIGTERM ends the step under way, writes its checkpoint, exits 130 and names --resume; the
    resumed run then ends as an uninterrupted one would (same metrics but timings, same adapter)."""
    import signal
    import time

    data = write_pairs(tmp_path / "pairs.jsonl", 160)
    env = {**os.environ, "LLMRL_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [*LLMRL, "reward", "train", "--model", str(tiny_model_dir), "--data", str(data), "--set", "rm.epochs=4",
           "--set", "checkpoint.every=1000", "--set", "lora.r=4", "--set", "rm.eval_every=0"]
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "stopped")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics, deadline = tmp_path / "stopped/metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 4):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err and (tmp_path / "stopped/checkpoints").is_dir()
    done = subprocess.run([*LLMRL, "reward", "train", "--resume", str(tmp_path / "stopped")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    subprocess.run([*cmd, "--out", str(tmp_path / "full")], env=env, check=True, capture_output=True)
    assert run_metrics(tmp_path / "stopped") == run_metrics(tmp_path / "full")


def test_a_reward_model_trains_on_a_4bit_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`model.quantize=nf4`: the base's linear layers held by bitsandbytes in 4 bits under the reward adapter;
    the run learns (the marker ranked right, the held-out loss halved) and its reward.json names the base's
    quantisation, which an RL run compares with its own."""
    from llmrl.models.quantized import four_bit_layers

    config = reward_config(tiny_model_dir, write_pairs(tmp_path / "pairs.jsonl"), tmp_path / "rm",
                           "model.quantize=nf4")
    base, _ = load_base(config.model, False)
    assert four_bit_layers(base)
    result = train_reward(config, show_progress=False)
    assert result.after["eval_accuracy"] == 1.0 and result.after["eval_loss"] < 0.5 * result.before["eval_loss"]
    assert json.loads((tmp_path / "rm/reward.json").read_text())["quantize"] == "nf4"
