"""Issue 6's bad-input rows not covered elsewhere, through the real CLI: one sentence on stderr,
the documented exit code, no traceback (docs/errors.md lists each row with its test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForSequenceClassification, T5Config
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.models.tokenizer import build_char_tokenizer

SMALL = ["--steps", "1", "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folders that look like models but are not causal LMs, and broken model files."""
    root = tmp_path_factory.mktemp("bad-models")
    tok = build_char_tokenizer()
    small = dict(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    T5Config(vocab_size=len(tok), d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=16).save_pretrained(root / "t5")
    tok.save_pretrained(root / "t5")
    LlamaConfig(**small).save_pretrained(root / "no-weights")
    tok.save_pretrained(root / "no-weights")
    LlamaForSequenceClassification(LlamaConfig(**small, num_labels=1, pad_token_id=0)).save_pretrained(root / "classifier")
    tok.save_pretrained(root / "classifier")
    (root / "bad-json").mkdir()
    (root / "bad-json" / "config.json").write_text("{not json")
    (root / "garbage.gguf").write_bytes(b"this is not a GGUF file")
    # a GGUF header that promises tensors and metadata the file does not hold (a download cut short):
    # magic, version 3, 1 tensor, 1 metadata entry, then the file ends inside the entry's key length
    (root / "cut.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little")
                                    + (1).to_bytes(8, "little") + b"\x05\x00")
    return root


def _run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _one_line(code: int, stdout: str, stderr: str, expected_code: int, message: str) -> None:
    assert code == expected_code, stderr
    assert message in stderr, stderr
    assert "Traceback" not in stdout + stderr and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("t5", "Cannot load model '{path}' as a causal LM: Unrecognized configuration class"),
        ("no-weights", "Cannot load model '{path}' as a causal LM: Error no file named model.safetensors"),
        ("bad-json", "Cannot load model '{path}' as a causal LM: It looks like the config file"),
        ("classifier", "Model '{path}' is a LlamaForSequenceClassification, not a causal language model"),
        ("garbage.gguf", "Cannot load model '{path}' as a causal LM: {path} does not start with the GGUF magic bytes"),
        ("cut.gguf", "Cannot load model '{path}' as a causal LM: the file is cut short or damaged"),
        ("missing.gguf", "Model file '{path}' does not exist."),
    ],
)
def test_model_that_is_not_a_causal_lm(models: Path, tmp_path: Path, name: str, message: str) -> None:
    path = models / name
    _one_line(*_run(["train", "--model", str(path), "--out", str(tmp_path / "r"), *SMALL]), 2,
              message.format(path=path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("algo: [unclosed\n", "is not valid YAML (line 2)"),
        ("algo: ppo\n\tsteps: 3\n", "is not valid YAML"),
        ("update:\n  lr_actr: 0.1\n", "Unknown setting 'update.lr_actr'; did you mean 'update.lr_actor'?"),
        ("steps: many\n", "'steps' must be int, got 'many'."),
        ("- a\n- b\n", "must hold a mapping of settings, not list"),
    ],
)
def test_bad_recipe_file(tmp_path: Path, text: str, message: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    _one_line(*_run(["train", "--recipe", str(recipe), "--out", str(tmp_path / "r")]), 2, message)
    assert not (tmp_path / "r").exists()


def test_output_folder_under_a_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Not writable even for root: the run folder's parent is a regular file."""
    (tmp_path / "file").write_text("x")
    _one_line(*_run(["train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "file" / "run"), *SMALL]), 1,
              f"Cannot write to run folder '{tmp_path / 'file' / 'run'}': Not a directory.")


def test_resume_without_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Steps were logged but none checkpointed (a run with no completed step restarts instead:
    test_qa_files.py)."""
    import yaml

    from llmrl.config.load import load_config, to_tree

    whole = to_tree(load_config(overrides={"algo": "ppo", "model.name": str(tiny_model_dir), "out": str(tmp_path)}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(whole))  # a whole run config, as a run writes it
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    _one_line(*_run(["train", "--resume", str(tmp_path)]), 2,
              f"'{tmp_path}' has no checkpoint to resume from; start it again with --overwrite.")


def test_group_estimator_with_one_sample_per_prompt(tmp_path: Path) -> None:
    _one_line(*_run(["train", "--algo", "grpo", "--set", "rollout.num_generations=1", "--set", "update.minibatch_size=8",
                     "--out", str(tmp_path / "r")]), 2,
              "Estimator 'grpo' compares samples of a prompt; set rollout.num_generations ≥ 2.")
    assert not (tmp_path / "r").exists()


# ---- reward runs (issue 67): `llmrl reward train`, `llmrl train --reward RUN`, and the two --resume mix-ups ----

RL_SMALL = ["--task", "arithmetic", "--steps", "1", "--set", "rollout.prompts_per_step=4", "--set",
            "update.minibatch_size=4", "--set", "eval.size=2", "--set", "eval.every=0", "--set", "threads=1"]
PAIRS = "".join(f'{{"prompt": "{a}+1=", "chosen": "{a + 1}", "rejected": "{a + 2}"}}\n' for a in range(12))


@pytest.fixture(scope="module")
def reward_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished reward run on the tiny model, built by hand with plain peft (tests/reward_runs.py); its adapter
    names no base (base_model_name_or_path null), as `llmrl reward train` writes it for a local base."""
    from tests.reward_runs import build_reward_run

    run = tmp_path_factory.mktemp("bad-reward") / "rm"
    build_reward_run(run, tiny_model_dir)
    config = run / "adapter" / "adapter_config.json"
    config.write_text(_json_edit(base_model_name_or_path=None)(config.read_text()))
    return run


def _edited(run: Path, tmp_path: Path, rel: str, edit) -> Path:  # noqa: ANN001 - edit: a file's text → new text
    """A copy of `run` with its file `rel` rewritten by `edit` (text in, text out)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / rel).write_text(edit((copy / rel).read_text()))
    return copy


DROP = object()  # a `_json_edit` value: delete the key


def _json_edit(**changes):  # noqa: ANN202
    """An `edit` for `_edited`: the JSON object with `changes` applied (DROP deletes the key)."""
    import json

    def edit(text: str) -> str:
        data = json.loads(text)
        for key, value in changes.items():
            data.pop(key) if value is DROP else data.__setitem__(key, value)
        return json.dumps(data)
    return edit


@pytest.mark.parametrize(
    ("rel", "edit", "message"),
    [
        ("reward.json", lambda t: t[:20], "has a reward.json llmrl cannot use (it is not JSON: "),
        ("reward.json", lambda t: "[]", "has a reward.json llmrl cannot use (it holds a list, not an object)"),
        ("reward.json", _json_edit(base=3), "has a reward.json llmrl cannot use (its base is 3, not a model name)"),
        ("reward.json", _json_edit(quantize=None), "(its quantize is None, not one of none, nf4, fp4)"),
        ("reward.json", _json_edit(base=DROP), "names no base model (its reward.json has no 'base' and its "
                                               "adapter_config.json has no base_model_name_or_path)"),
        ("reward.json", _json_edit(base="/models/gone"), "The base of reward model '{run}' cannot be loaded: Model "
                                                         "folder '/models/gone' does not exist or has no config.json."),
        ("adapter/adapter_config.json", _json_edit(r=DROP), "has an adapter_config.json peft cannot use: it lacks 'r'."),
        ("adapter/adapter_config.json", _json_edit(r="four"), "peft cannot use: 'r' is 'four', not an integer ≥ 1."),
        ("adapter/adapter_config.json", lambda t: "[1]", "is not a LoRA sequence classifier (peft_type None"),
        ("adapter/adapter_config.json", _json_edit(target_modules=["nope"]),
         "does not fit this base (its target_modules ['nope'] match no layer of it); it was trained on another model"),
    ],
)
def test_a_damaged_reward_run_given_to_train(reward_run: Path, tiny_model_dir: Path, tmp_path: Path, rel: str,
                                             edit, message: str) -> None:  # noqa: ANN001
    """Each was a traceback (the last resort's sentence, exit 1), a wrong reason, or a run that trained on (a null
    quantize) before issue 67's fuzzing; the run folder is not made where the check can come first."""
    run = _edited(reward_run, tmp_path, rel, edit)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    _one_line(*_run(["train", "--model", str(tiny_model_dir), *RL_SMALL, "--reward", str(run),
                     "--out", str(tmp_path / "r")]), 2, message.format(run=run))
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing of the reward run deleted


def _other_tensors(run: Path, change) -> None:  # noqa: ANN001 - change: the tensors dict, edited in place
    from safetensors.torch import load_file, save_file

    path = run / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.__setitem__("base_model.model.score.weight", __import__("torch").zeros(1, 7)),
         "does not fit this base (its score head is (1, 7), the base's hidden size 32)"),
        (lambda t: t.__setitem__(next(k for k in sorted(t) if "lora_A" in k), __import__("torch").zeros(4, 7)),
         "does not fit this base (size mismatch for base_model.model.model.layers.0."),
    ],
)
@pytest.mark.parametrize("critic", [False, True])
def test_a_reward_adapter_of_another_model(reward_run: Path, tiny_model_dir: Path, tmp_path: Path, change,
                                           message: str, critic: bool) -> None:  # noqa: ANN001
    """Tensors that do not fit the actor's base (another width): one sentence, as the fourth role and as the
    critic's start (lora.critic_from_reward); was a matmul error at the first score, or the last resort."""
    import shutil

    run = tmp_path / "rm"
    shutil.copytree(reward_run, run)
    _other_tensors(run, change)
    extra = ["--algo", "ppo", "--set", "lora.critic_from_reward=true"] if critic else []
    _one_line(*_run(["train", "--model", str(tiny_model_dir), *RL_SMALL, *extra, "--reward", str(run),
                     "--out", str(tmp_path / "r")]), 2, f"Reward adapter '{run / 'adapter'}' {message}")


def test_a_peft_reward_adapter_without_its_base(reward_run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    _one_line(*_run(["train", "--model", str(tiny_model_dir), *RL_SMALL, "--reward", str(reward_run / "adapter"),
                     "--out", str(tmp_path / "r")]), 2,
              f"Reward model '{reward_run / 'adapter'}' names no base model (its adapter_config.json has no "
              "base_model_name_or_path); llmrl cannot tell what to load it on.")
    assert not (tmp_path / "r").exists()


def test_critic_from_reward_without_a_reward_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    _one_line(*_run(["train", "--model", str(tiny_model_dir), *RL_SMALL, "--algo", "ppo", "--set",
                     "lora.critic_from_reward=true", "--out", str(tmp_path / "r")]), 2,
              "'lora.critic_from_reward' starts the critic from a reward run on the actor's base; reward.functions "
              "holds none")


def test_a_reward_run_as_the_model(reward_run: Path, tmp_path: Path) -> None:
    """Was `Model folder '…' does not exist or has no config.json.` of a folder that exists."""
    for args in (["train", *RL_SMALL], ["reward", "train", "--data", str(tmp_path / "p.jsonl")]):
        (tmp_path / "p.jsonl").write_text(PAIRS)
        _one_line(*_run([*args, "--model", str(reward_run), "--out", str(tmp_path / "r")]), 2,
                  f"'{reward_run}' is a reward run (llmrl reward train), not a model: score with it through "
                  f"--reward {reward_run}, and give its base as the model.")


def test_the_two_resumes_mixed_up(reward_run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    import yaml

    from llmrl.config.load import load_config, to_tree

    rl = tmp_path / "rl"
    rl.mkdir()
    (rl / "config.yaml").write_text(yaml.safe_dump(to_tree(load_config(overrides={"model.name": str(tiny_model_dir),
                                                                                   "out": str(rl)}))))
    _one_line(*_run(["reward", "train", "--resume", str(rl)]), 2,
              f"'{rl}' is an RL run (llmrl train), not a reward run; resume it with `llmrl train --resume {rl}`.")
    _one_line(*_run(["train", "--resume", str(reward_run)]), 2,
              f"'{reward_run}' is a reward run (llmrl reward train), not an RL run; resume it with "
              f"`llmrl reward train --resume {reward_run}`")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a whole reward run config (it lacks model, lora, pairs, rm): it was cut short or edited"),
        ("rm: [\n", "is not a whole reward run config (it is not valid YAML: while parsing a flow node)"),
        ("model:\n  name: x\n", "is not a whole reward run config (it lacks lora, pairs, rm)"),
    ],
)
def test_resume_of_a_reward_run_whose_config_was_damaged(reward_run: Path, tmp_path: Path, text: str,
                                                         message: str) -> None:
    """Was the last resort (ScannerError, AttributeError) or, without reward.json, 'is an RL run'."""
    run = _edited(reward_run, tmp_path, "config.yaml", lambda t: text)
    for finished in (True, False):
        if not finished:
            (run / "reward.json").unlink()
        _one_line(*_run(["reward", "train", "--resume", str(run)]), 2, f"'{run / 'config.yaml'}' {message}")


def test_resume_of_a_finished_reward_run_changes_nothing(reward_run: Path) -> None:
    """As `llmrl train --resume` of a finished run: exit 0, one line, no file rewritten (it trained again)."""
    before = {p: p.read_bytes() for p in reward_run.rglob("*") if p.is_file()}
    code, out, err = _run(["reward", "train", "--resume", str(reward_run)])
    assert code == 0 and f"'{reward_run}' has finished; nothing to resume" in out, err
    assert {p: p.read_bytes() for p in reward_run.rglob("*") if p.is_file()} == before


def test_reward_train_bad_lora_targets_and_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    """lora.target_modules naming no layer was the last resort (peft's NoMatchingPeftModuleError); an --out that
    is a file, or a folder of the user's (with --overwrite too), is refused and left as it was."""
    data = tmp_path / "p.jsonl"
    data.write_text(PAIRS)
    base = ["reward", "train", "--model", str(tiny_model_dir), "--data", str(data), "--set", "threads=1"]
    _one_line(*_run([*base, "--set", "lora.target_modules=[nope]", "--out", str(tmp_path / "r")]), 2,
              "'lora.target_modules' ['nope'] matches no linear layer of the model; its linear layers: down_proj")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        _one_line(*_run([*base, "--out", str(mine), *extra]), 2,
                  f"'{mine}' is not empty and holds no run; choose an empty or new --out folder.")
    _one_line(*_run([*base, "--out", str(data)]), 1, f"Cannot write to run folder '{data}': File exists.")
    assert (mine / "notes.txt").read_text() == "mine" and data.read_text() == PAIRS
