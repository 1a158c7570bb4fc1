"""docs/from-trl-ppo.md is true to llmrl: every setting its table names exists, every value it gives
("`key` = value", the tiny model's after it as "(tiny: value)") is what `--algo ppo` resolves to for a
real model on a CPU and for the built-in tiny model, its missing-EOS translation penalises what it
says, its worked recipe is TRL's example's numbers, and the reward command and setting it names exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from llmrl.config import load_config, to_tree
from llmrl.config.load import field_types, flatten

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "from-trl-ppo.md"
RECIPE = ROOT / "recipes" / "from-trl-ppo.yaml"
REAL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # any name but the built-in ones gets a real model's defaults
KEY = re.compile(r"^[a-z_]+(?:\.[a-z_]+)*$")
VALUE = r"(`[^`]+`|[-\w.+]+)"
PAIR = re.compile(rf"`([a-z_.]+)` = {VALUE}(?: \(tiny: {VALUE}\))?")


def settings_rows() -> list[list[str]]:
    """The cells of the settings table (the one whose header starts with TRL's `PPOConfig`)."""
    rows, inside = [], False
    for line in PAGE.read_text().splitlines():
        if line.startswith("| TRL `PPOConfig`"):
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
        elif inside and not line.startswith("|"):
            break
    return rows


def value(text: str) -> Any:
    """A value as the page writes it: a number, null, true/false, or a backticked word."""
    text = text.strip("`")
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"null": None, "true": True, "false": False}.get(text, text)


def resolved(model: str) -> dict[str, Any]:
    """Every dotted key's value under --algo ppo for `model` (float32: no dtype probe)."""
    cfg = load_config(None, {"algo": "ppo", "model.name": model}, ["model.dtype=float32"])
    return flatten(to_tree(cfg))


def test_the_page_has_its_settings_table() -> None:
    rows = settings_rows()
    assert len(rows) >= 25, len(rows)
    assert all(len(r) == 3 for r in rows), [r for r in rows if len(r) != 3]


def test_every_llmrl_key_the_table_names_is_a_setting() -> None:
    keys = set(field_types())
    named = [w for _, llmrl, _ in settings_rows() for w in re.findall(r"`([^`]+)`", llmrl) if KEY.match(w) and "." in w]
    named += [k for _, llmrl, _ in settings_rows() for k, *_ in PAIR.findall(llmrl)]
    assert named
    assert not [k for k in named if k not in keys], [k for k in named if k not in keys]


def test_every_value_the_table_gives_is_the_resolved_default() -> None:
    real, tiny = resolved(REAL), resolved("tiny")
    wrong, checked = [], 0
    for _, llmrl, differs in settings_rows():  # the third column names a few llmrl values too
        for key, shown, tiny_shown in PAIR.findall(f"{llmrl} {differs}"):
            want_real = value(shown)
            want_tiny = value(tiny_shown) if tiny_shown else want_real
            checked += 1
            if real[key] != want_real or tiny[key] != want_tiny:
                wrong.append(f"{key}: page {want_real!r} (tiny {want_tiny!r}), code {real[key]!r} (tiny {tiny[key]!r})")
    assert checked >= 35, checked
    assert not wrong, wrong


def test_the_missing_eos_translation_penalises_only_a_full_length_response() -> None:
    """A buffer under one token: 0 below rollout.max_new_tokens, the whole penalty at it, as the page says."""
    from llmrl.step.overlong import overlong_penalty

    cfg = load_config(RECIPE, None, ["model.dtype=float32"])
    limit, buffer = cfg.rollout.max_new_tokens, cfg.reward.overlong_buffer
    assert buffer is not None and buffer * limit <= 1
    lengths = torch.tensor([1.0, limit - 1, limit])
    got = overlong_penalty(lengths, limit, buffer, cfg.reward.overlong_penalty)
    assert got.tolist() == [0.0, 0.0, -1.0]


def test_the_recipe_is_trls_example() -> None:
    """The numbers the page says the recipe takes from TRL's example command and PPOConfig's defaults."""
    cfg = load_config(RECIPE, None, ["model.dtype=float32"])
    trl = {"per_device_train_batch_size": 64, "total_episodes": 10000, "num_ppo_epochs": 4, "num_mini_batches": 1,
           "response_length": 53, "temperature": 0.7, "kl_coef": 0.05, "cliprange": 0.2, "cliprange_value": 0.2,
           "vf_coef": 0.1, "gamma": 1.0, "lam": 0.95, "seed": 42}
    rows = cfg.rollout.prompts_per_step * cfg.rollout.num_generations
    assert rows == trl["per_device_train_batch_size"] and cfg.rollout.num_generations == 1
    assert cfg.steps == -(-trl["total_episodes"] // rows) == 157
    assert (cfg.update.epochs, rows // cfg.update.minibatch_size) == (trl["num_ppo_epochs"], trl["num_mini_batches"])
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (trl["response_length"], trl["temperature"])
    assert (cfg.kl.beta, cfg.kl.estimator, cfg.kl.placement) == (trl["kl_coef"], "k1", "reward")
    assert (cfg.update.clip_eps, cfg.update.value_clip, cfg.update.vf_coef) == (
        trl["cliprange"], trl["cliprange_value"], trl["vf_coef"])
    assert (cfg.estimator.gamma, cfg.estimator.lam, cfg.estimator.whiten) == (trl["gamma"], trl["lam"], True)
    assert (cfg.seed, cfg.update.lr_schedule, cfg.update.max_grad_norm) == (trl["seed"], "linear", None)
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (16, 32.0, 0.05, ["q_proj", "v_proj"])


def test_the_reward_paragraph_matches_the_cli_and_the_settings() -> None:
    """The page names `llmrl reward train` and lora.critic_from_reward: both exist."""
    import typer

    from llmrl.cli import app

    text = re.sub(r"\s+", " ", PAGE.read_text())
    reward = typer.main.get_command(app).commands.get("reward")
    assert "`llmrl reward train --model M --data PAIRS --out RUN`" in text
    assert reward is not None and "train" in reward.commands, "the page names `llmrl reward train`: the CLI has none"
    assert "`lora.critic_from_reward: true`" in text and "lora.critic_from_reward" in field_types()


def test_the_readme_links_the_page() -> None:
    assert "](docs/from-trl-ppo.md)" in (ROOT / "README.md").read_text()
