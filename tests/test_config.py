"""Config loading: precedence, validation messages, presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrl.config import load_config
from llmrl.config.load import parse_override
from llmrl.errors import ConfigError


def test_defaults_are_ppo_with_gae() -> None:
    cfg = load_config()
    assert cfg.algo == "ppo" and cfg.estimator.name == "gae"
    assert cfg.kl.placement == "reward" and cfg.kl.estimator == "k1"


def test_precedence_preset_then_recipe_then_overrides(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algo: grpo\nkl:\n  beta: 0.1\nupdate:\n  lr_actor: 0.01\n")
    cfg = load_config(recipe, {"steps": 7}, ["update.lr_actor=1e-3"])
    assert cfg.estimator.name == "grpo"  # from the grpo preset
    assert cfg.rollout.num_generations == 4  # preset
    assert cfg.kl.beta == 0.1  # recipe beats preset (0.04)
    assert cfg.update.lr_actor == 1e-3  # --set beats recipe; '1e-3' parsed as a float
    assert cfg.steps == 7


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("update.lr_actr=1", "did you mean 'update.lr_actor'"),
        ("lr_actor=1", "did you mean 'update.lr_actor'"),
        ("steps=abc", "'steps' must be int"),
        ("steps=0", "'steps' must be ≥ 1"),
        ("kl.estimator=k9", "'kl.estimator' must be one of k1, k2, k3"),
        ("rollout.top_p=1.5", "'rollout.top_p' must be ≤ 1"),
        ("rollout.temperature=0", "'rollout.temperature' must be > 0"),
        ("kl.adaptive=maybe", "'kl.adaptive' must be true or false"),
        ("steps", "--set expects key=value"),
    ],
)
def test_bad_values_name_the_key(item: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(sets=[item])


def test_unknown_algo_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="valid algorithms: ppo, reinforce"):
        load_config(overrides={"algo": "ppp"})


def test_recipe_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


def test_minibatch_larger_than_batch_is_refused() -> None:
    with pytest.raises(ConfigError, match="exceeds the rows per step"):
        load_config(sets=["rollout.prompts_per_step=4", "update.minibatch_size=8"])


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(AttributeError):
        cfg.steps = 3  # type: ignore[misc]


def test_parse_override_types() -> None:
    assert parse_override("a=1") == ("a", 1)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=null") == ("a", None)
    assert parse_override("a=q_proj,v_proj") == ("a", "q_proj,v_proj")
    cfg = load_config(sets=["lora.target_modules=q_proj,v_proj", "update.clip_eps_high=0.28"])
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.update.clip_eps_high == 0.28


def test_a_set_value_with_a_colon_is_text_and_a_flow_mapping_a_mapping() -> None:
    text = "Think step by step: write out your reasoning first, then give the final answer."
    assert parse_override(f"data.system_prompt={text}") == ("data.system_prompt", text)  # YAML alone: a mapping
    assert load_config(sets=[f"data.system_prompt={text}"]).data.system_prompt == text
    assert parse_override("a={b: 1}") == ("a", {"b": 1})
    assert parse_override('a="x: y"') == ("a", "x: y")


def test_recipes_in_repo_load() -> None:
    recipes = sorted(Path(__file__).parent.parent.joinpath("recipes").glob("*.yaml"))
    assert recipes, "recipes/ must ship at least one recipe"
    from llmrl.config.reward_run import load_reward_config

    for recipe in recipes:  # a reward run's recipe (its `rm` section) is a RewardRunConfig (config/reward_run.py)
        (load_reward_config if "\nrm:" in recipe.read_text() else load_config)(recipe)
