"""Dynamic sampling (rollout.filter_groups, rollout.max_draws, rollout.oversample): step/groups.py and run/draws.py.

Runs use a random tiny model and a reward that is 0 for every completion of a prompt whose answer
is below 100 (such a group is always all-equal) and len(completion) mod 2 otherwise (such a group
mostly has both values), so which groups a step may train on is known from the prompt alone.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from llmrl import load_config, read_run, train
from llmrl.step.groups import extra_prompts, informative, join_samples, join_scores, select_groups
from llmrl.step.overlong import sequence_rewards
from llmrl.step.records import EpisodeLog, Samples, Scores
from tests.helpers import CLI_SMALL, cli_refused, cli_run, is_timing

REWARD = '''
def parity_above_100(prompts, completions, answer, **_):
    return [0.0 if int(a) < 100 else float(len(c) % 2) for c, a in zip(completions, answer)]
'''
B, G = 8, 4


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("reward") / "parity.py"
    path.write_text(REWARD)
    return f"{path}:parity_above_100"


def _run(tiny_model_dir: Path, out: Path, reward: str, *sets: str, steps: int = 2):
    sets_ = [f"rollout.prompts_per_step={B}", f"rollout.num_generations={G}", "update.minibatch_size=8",
             "eval.size=4", "eval.every=0", "threads=1", "log.completions_every=1", f"log.completions_rows={4 * B * G}",
             "rollout.max_new_tokens=4", "kl.beta=0", *sets]
    train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(out), "steps": steps, "algo": "grpo",
                                 "reward.functions": [reward]}, sets=sets_))
    run = read_run(out)
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    return run, logged


def _groups(logged: list[dict], step: int) -> list[list[dict]]:
    rows = [r for r in logged if r["step"] == step]
    return [rows[i : i + G] for i in range(0, len(rows), G)]


# --- the pure pieces -----------------------------------------------------------------------------

def test_informative_groups_table() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.0, 0.0, 1e-3])
    # groups of 3: [1,1,1] equal, [0,0,0] equal, [.5,.5,.5] equal, [0,0,1e-3] differs
    assert informative(scores, 3).tolist() == [False, False, False, True]
    # groups of 2: [1,1] [1,0] [0,0] [.5,.5] [.5,0] [0,1e-3]
    assert informative(scores, 2).tolist() == [False, True, False, False, True, True]


def _samples(prompt_lens: list[int], resp_lens: list[int], g: int, offset: int = 0) -> tuple[Samples, Scores]:
    """Rows with left-padded prompts and right-padded responses of the given lengths; token ids are
    100·row + position so each row's tokens can be recognised after selection and padding."""
    n, p, t = len(resp_lens), max(prompt_lens), max(resp_lens)
    ids = torch.zeros(n, p, dtype=torch.long)
    pmask = torch.zeros(n, p, dtype=torch.bool)
    rids = torch.zeros(n, t, dtype=torch.long)
    rmask = torch.zeros(n, t, dtype=torch.bool)
    for i, (lp, lr) in enumerate(zip(prompt_lens, resp_lens)):
        ids[i, p - lp:] = 100 * (i + offset) + torch.arange(lp) + 1
        pmask[i, p - lp:] = True
        rids[i, :lr] = 100 * (i + offset) + 50 + torch.arange(lr)
        rmask[i, :lr] = True
    mu = torch.where(rmask, -0.5, 0.0)
    rows = tuple({"prompt": f"q{k + offset // g}"} for k in range(n // g))
    s = Samples(rows, ids, pmask, rids, rmask, g, torch.arange(n) // g + offset // g,
                tuple(f"c{i + offset}" for i in range(n)), mu)
    return s, Scores(torch.arange(n, dtype=torch.float32) + offset, {"a": torch.ones(n)})


def test_select_groups_keeps_whole_groups_in_order_and_trims_padding() -> None:
    samples, scores = _samples([3, 3, 5, 5, 2, 2], [1, 4, 2, 2, 6, 1], g=2)
    kept, kept_scores = select_groups(samples, scores, torch.tensor([2, 0]))
    # groups 2 then 0 = rows 4, 5, 0, 1; the longest kept prompt is 3 tokens (group 1's 5 are gone),
    # the longest kept response 6 tokens
    assert kept.rows == ({"prompt": "q2"}, {"prompt": "q0"}) and kept.completions == ("c4", "c5", "c0", "c1")
    assert kept.prompt_ids.shape == (4, 3) and kept.response_ids.shape == (4, 6)
    assert kept.prompt_ids[0].tolist() == [0, 401, 402] and kept.prompt_ids[2].tolist() == [1, 2, 3]
    assert kept.response_mask.sum(1).tolist() == [6, 1, 1, 4]
    assert kept.prompt_index.tolist() == [2, 2, 0, 0] and kept_scores.scores.tolist() == [4.0, 5.0, 0.0, 1.0]
    assert kept.behaviour_logprobs.sum().item() == -0.5 * 12
    # trimming only dropped padding: every kept row holds the same real tokens as before
    for new, old in enumerate([4, 5, 0, 1]):
        assert kept.response_ids[new][kept.response_mask[new]].tolist() == samples.response_ids[old][samples.response_mask[old]].tolist()
        assert kept.prompt_ids[new][kept.prompt_mask[new]].tolist() == samples.prompt_ids[old][samples.prompt_mask[old]].tolist()
    narrow, _ = select_groups(samples, scores, torch.tensor([0]))
    assert narrow.prompt_ids.shape == (2, 3) and narrow.response_ids.shape == (2, 4)


def test_join_pads_rounds_to_one_batch() -> None:
    a, sa = _samples([2, 2], [3, 1], g=2)
    b, sb = _samples([4, 1], [1, 5], g=2, offset=2)
    joined, scores = join_samples([a, b], pad_id=0), join_scores([sa, sb])
    assert joined.prompt_ids.shape == (4, 4) and joined.response_ids.shape == (4, 5)
    assert joined.prompt_mask.sum(1).tolist() == [2, 2, 4, 1] and joined.response_mask.sum(1).tolist() == [3, 1, 1, 5]
    assert joined.prompt_ids[0].tolist() == [0, 0, 1, 2] and joined.response_ids[0].tolist() == [50, 51, 52, 0, 0]
    assert joined.behaviour_logprobs.shape == (4, 5) and not joined.behaviour_logprobs.masked_select(~joined.response_mask).any()
    assert scores.scores.tolist() == [0.0, 1.0, 2.0, 3.0] and scores.parts["a"].tolist() == [1.0] * 4
    assert joined.rows == a.rows + b.rows and joined.prompt_index.tolist() == [0, 0, 1, 1]


def _as_episodes(samples: Samples, env_at: dict[int, list[int]]) -> Samples:
    """The samples as episodes: row i's response positions env_at[i] are the environment's tokens
    (context, not trained), and its episode log holds i in every field (turns = i + 1)."""
    action, context = samples.response_mask.clone(), samples.response_mask.clone()
    for i, cols in env_at.items():
        action[i, cols] = False
    n = samples.n
    log = EpisodeLog(torch.arange(n) + 1, torch.arange(n), torch.arange(n), torch.arange(n, dtype=torch.float32),
                     torch.tensor([len(env_at.get(i, [])) for i in range(n)]), 0.25)
    return replace(samples, response_mask=action, context_mask=context, episodes=log)


def test_selecting_and_joining_episodes_keeps_their_masks_and_logs() -> None:
    # row 4's response is 6 tokens whose last but one (col 4) is the environment's, row 0's 1 token
    samples, scores = _samples([3, 3, 5, 5, 2, 2], [1, 4, 2, 2, 6, 1], g=2)
    episodes = _as_episodes(samples, {4: [4], 1: [1, 2]})
    kept, _ = select_groups(episodes, scores, torch.tensor([2, 0]))  # rows 4, 5, 0, 1
    assert kept.context_mask.shape == kept.response_mask.shape == (4, 6)
    assert kept.context_mask.sum(1).tolist() == [6, 1, 1, 4] and kept.response_mask.sum(1).tolist() == [5, 1, 1, 2]
    assert kept.episodes.turns.tolist() == [5, 6, 1, 2] and kept.episodes.env_tokens.tolist() == [1, 0, 0, 2]
    assert kept.episodes.env_reward.tolist() == [4.0, 5.0, 0.0, 1.0] and kept.episodes.env_time_s == 0.25
    # an environment span that ends a row's kept columns is never trimmed away: trimming reads the context
    tail = _as_episodes(samples, {4: [5]})
    kept, _ = select_groups(tail, scores, torch.tensor([2]))
    assert kept.response_ids.shape[1] == 6 and kept.context_mask[0].tolist() == [True] * 6
    a = _as_episodes(*_samples([2, 2], [3, 1], g=2)[:1], {0: [1]})
    b = _as_episodes(*_samples([4, 1], [1, 5], g=2, offset=2)[:1], {1: [2, 3]})
    joined = join_samples([a, b], pad_id=0)
    assert joined.context_mask.shape == (4, 5) and joined.context_mask.sum(1).tolist() == [3, 1, 1, 5]
    assert joined.response_mask.sum(1).tolist() == [2, 1, 1, 3]
    assert joined.episodes.turns.tolist() == [1, 2, 1, 2] and joined.episodes.env_time_s == 0.5
    assert join_samples([a, _samples([1, 1], [1, 1], g=2)[0]], pad_id=0).episodes is None


def test_extra_prompts_are_new_seeded_and_run_out() -> None:
    first = extra_prompts(10, {0, 1, 2}, 4, seed=0, step=3, draw=1)
    assert len(first) == 4 and not set(first.tolist()) & {0, 1, 2}
    assert torch.equal(first, extra_prompts(10, {0, 1, 2}, 4, seed=0, step=3, draw=1))  # a resumed run draws the same
    assert not torch.equal(first, extra_prompts(10, {0, 1, 2}, 4, seed=0, step=3, draw=2))
    assert sorted(extra_prompts(10, set(range(7)), 9, 0, 0, 1).tolist()) == [7, 8, 9]  # only 3 are left


def test_the_filter_compares_what_the_estimator_sees_score_plus_overlong_penalty() -> None:
    """Equal scores, lengths inside DAPO's buffer: the estimator sees score + penalty, so the group has
    non-zero advantages and is kept. L_max = 10, buffer 0.2 (L_cache = 2): |y| = 8 → 0, 9 → −0.5, 10 → −1."""
    config = load_config(overrides={"rollout.max_new_tokens": 10, "reward.overlong_buffer": 0.2,
                                    "reward.overlong_penalty": 1.0})
    lengths = [8, 9, 10, 7, 8, 8]
    mask = torch.tensor([[t < n for t in range(10)] for n in lengths])
    samples = Samples((), torch.zeros(6, 1, dtype=torch.long), torch.ones(6, 1, dtype=torch.bool),
                      torch.zeros(6, 10, dtype=torch.long), mask, 2, torch.arange(3).repeat_interleave(2), ("",) * 6)
    scores = torch.ones(6)
    seen = sequence_rewards(samples, scores, config)
    torch.testing.assert_close(seen, torch.tensor([1.0, 0.5, 0.0, 1.0, 1.0, 1.0]), atol=1e-6, rtol=0)
    assert informative(scores, 2).tolist() == [False, False, False]  # the raw scores: every group dropped
    assert informative(seen, 2).tolist() == [True, True, False]  # [1, .5] and [0, 1] carry signal; [1, 1] none
    plain = load_config(overrides={"rollout.max_new_tokens": 10})
    assert sequence_rewards(samples, scores, plain) is scores  # no buffer: the scores themselves


# --- runs ----------------------------------------------------------------------------------------

def test_filter_trains_only_on_groups_whose_rewards_differ(tiny_model_dir: Path, tmp_path: Path, reward_file: str) -> None:
    run, logged = _run(tiny_model_dir, tmp_path / "f", reward_file, "rollout.filter_groups=true")
    plain, plain_logged = _run(tiny_model_dir, tmp_path / "p", reward_file)
    for row in run.metrics:
        step = row["step"]
        groups = _groups(logged, step)
        assert row["ds_draws"] == 0 and row["ds_prompts"] == B
        assert row["groups_kept"] + row["groups_dropped"] == B and row["groups_kept"] == len(groups) > 0
        assert row["kept_share"] == row["groups_kept"] / B  # the loss scale of rollout.filter_scale
        # every trained group has an answer ≥ 100 and two different rewards; no such group was dropped
        assert all(int(g[0]["answer"]) >= 100 and len({r["reward"] for r in g}) == 2 for g in groups)
        assert row["reward_mean_trained"] == pytest.approx(sum(r["reward"] for g in groups for r in g) / (G * len(groups)), abs=1e-6)
        assert row["tokens"] < plain.metrics[step - 1]["tokens"]  # fewer rows were trained on
    # before any update both runs draw the same round 0: the same informative groups are kept, and
    # the step's reward_mean is that of all B·G rows, as without the filter
    unfiltered = [g for g in _groups(plain_logged, 1) if len({r["reward"] for r in g}) == 2]
    assert [[r["completion"] for r in g] for g in unfiltered] == [[r["completion"] for r in g] for g in _groups(logged, 1)]
    assert run.metrics[0]["reward_mean"] == plain.metrics[0]["reward_mean"]
    assert run.metrics[0]["groups_dropped"] == sum(len({r["reward"] for r in g}) == 1 for g in _groups(plain_logged, 1))


def test_a_step_that_keeps_no_group_does_not_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    # a reward of 0 for every completion: every group is all-equal, nothing is kept, no step updates,
    # so the trained adapter is the initial one exactly (LoRA B = 0) and no loss was logged
    path = tmp_path / "zero.py"
    path.write_text("def zero(prompts, completions, **_):\n    return [0.0] * len(completions)\n")
    run, _ = _run(tiny_model_dir, tmp_path / "z", f"{path}:zero", "rollout.filter_groups=true", "update.lr_actor=1e-2")
    assert [r["groups_kept"] for r in run.metrics] == [0, 0] and all(r["time_update_s"] == 0 for r in run.metrics)
    assert not any("policy_loss" in r for r in run.metrics)
    weights = load_file(tmp_path / "z" / "adapters" / "actor" / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all(torch.count_nonzero(v) == 0 for v in lora_b)


def test_refill_draws_more_prompts_until_the_batch_is_full(tiny_model_dir: Path, tmp_path: Path, reward_file: str) -> None:
    run, logged = _run(tiny_model_dir, tmp_path / "r", reward_file, "rollout.filter_groups=true", "rollout.max_draws=6")
    for row in run.metrics:
        groups = _groups(logged, row["step"])
        assert row["groups_kept"] == len(groups) == B and 1 <= row["ds_draws"] <= 6 and row["ds_prompts"] > B
        assert all(int(g[0]["answer"]) >= 100 and len({r["reward"] for r in g}) == 2 for g in groups)
        prompts = [json.dumps(g[0]["prompt"]) for g in groups]
        assert len(set(prompts)) == B  # a step never draws a prompt twice
    # the rounds are keyed by (seed, step, round): the same run again writes the same rows
    again, again_logged = _run(tiny_model_dir, tmp_path / "r2", reward_file, "rollout.filter_groups=true", "rollout.max_draws=6")
    assert again_logged == logged
    strip = lambda rows: [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]  # noqa: E731
    assert strip(again.metrics) == strip(run.metrics)


def test_oversample_fills_the_batch_from_one_wider_first_round(tiny_model_dir: Path, tmp_path: Path, reward_file: str) -> None:
    over, over_logged = _run(tiny_model_dir, tmp_path / "o", reward_file, "rollout.filter_groups=true", "rollout.oversample=8")
    plain, plain_logged = _run(tiny_model_dir, tmp_path / "p", reward_file, "rollout.filter_groups=true")
    for row in over.metrics:
        groups = _groups(over_logged, row["step"])
        # one round of B + 8 = 16 prompts, no refill round; at most B groups are trained on, all informative
        assert row["ds_draws"] == 0 and row["ds_prompts"] == B + 8 and row["groups_kept"] == len(groups) <= B
        assert all(int(g[0]["answer"]) >= 100 and len({r["reward"] for r in g}) == 2 for g in groups)
        assert len({json.dumps(g[0]["prompt"]) for g in groups}) == len(groups)  # no prompt twice
    # step 1 (before any update): the stream's B prompts are those of the run without oversampling, so
    # reward_mean is the same number, the stream's informative groups come first and unchanged, and
    # the extra prompts' informative groups fill the rest of the batch
    assert over.metrics[0]["reward_mean"] == plain.metrics[0]["reward_mean"]
    stream = [[r["completion"] for r in g] for g in _groups(plain_logged, 1)]
    first = [[r["completion"] for r in g] for g in _groups(over_logged, 1)]
    assert first[: len(stream)] == stream and len(first) > len(stream)
    assert over.metrics[0]["groups_kept"] > plain.metrics[0]["groups_kept"]


def test_resumed_refill_run_matches_an_uninterrupted_one(tiny_model_dir: Path, tmp_path: Path, reward_file: str) -> None:
    sets = ("rollout.filter_groups=true", "rollout.max_draws=3", "checkpoint.every=1")
    whole, whole_logged = _run(tiny_model_dir, tmp_path / "w", reward_file, *sets, steps=3)
    _run(tiny_model_dir, tmp_path / "h", reward_file, *sets, steps=1)
    code, _, stderr = cli_run(["train", "--resume", str(tmp_path / "h"), "--steps", "3"])
    assert code == 0, stderr
    strip = lambda rows: [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]  # noqa: E731
    assert strip(read_run(tmp_path / "h").metrics) == strip(whole.metrics)


@pytest.mark.parametrize(("sets", "message"), [
    (["--algo", "grpo", "--set", "rollout.num_generations=1", "--set", "rollout.filter_groups=true"],
     "'rollout.filter_groups' drops groups whose rewards are all equal, which needs rollout.num_generations ≥ 2"),
    (["--set", "rollout.max_draws=2"], "'rollout.max_draws' (2) refills the groups rollout.filter_groups drops"),
    (["--set", "rollout.filter_scale=true"], "'rollout.filter_scale' scales the loss by the share of groups"),
    (["--set", "rollout.oversample=4"], "'rollout.oversample' (4) draws extra prompts for the groups rollout.filter_groups drops"),
    (["--algo", "grpo", "--set", "rollout.filter_groups=true", "--set", "kl.placement=reward", "--set", "kl.estimator=k1",
      "--set", "kl.beta=0.1"],
     "'rollout.filter_groups' compares a group's rewards before the forwards, but with KL in the reward "
     "(kl.placement=reward, kl.beta=0.1) the estimator sees them minus β·KL, known only after; use kl.placement=loss "
     "or kl.beta=0 (or rollout.filter_on=score to compare the scores alone)."),
])
def test_bad_dynamic_sampling_settings_are_refused(tiny_model_dir: Path, tmp_path: Path, sets: list[str], message: str) -> None:
    out = tmp_path / "run"
    cli_refused(["train", "--model", str(tiny_model_dir), "--out", str(out), *CLI_SMALL, *sets], message)
    assert not out.exists()
