"""DAPO's overlong settings on episodes (issue 45, item 1): L_max = rollout.max_new_tokens is a limit
per turn, so an episode is judged by its last turn — the only one that can have been cut — and not by
its model tokens summed over every turn (step/overlong.py)."""

from __future__ import annotations

import torch

from llmrl import load_config
from llmrl.step.overlong import apply_overlong, sequence_rewards, truncated_rows
from llmrl.step.records import EpisodeLog, Samples
from tests.helpers import close

STOP, TOK, ENV, PAD = 2, 5, 7, 0

# Each episode as its segments: ("m", k tokens, ends with the stop token?) or ("e", k tokens).
EPISODES = [
    [("m", 8, True), ("e", 5), ("m", 6, True)],  # 0: a calculator call at L_max, its result, a 6-token answer
    [("m", 6, True)],                             # 1: a direct answer of 6 tokens
    [("m", 3, True), ("e", 2), ("m", 3, True), ("e", 2), ("m", 3, True)],  # 2: a game of three short turns
    [("m", 2, True), ("e", 1), ("m", 3, False)],  # 3: the last turn cut by the episode's budget at 3 tokens
    [("m", 4, True), ("e", 0), ("m", 7, True)],   # 4: an empty answer between two turns; the last has 7
    [("m", 8, False)],                            # 5: one turn cut at L_max
]


def _episodes() -> Samples:
    ids, acted, index, turns = [], [], [], []
    for segments in EPISODES:
        row, act, idx, k = [], [], [], 0
        for seg in segments:
            if seg[0] == "m":
                k += 1
                row += [TOK] * (seg[1] - 1) + [STOP if seg[2] else TOK]
                act += [True] * seg[1]
                idx += [k] * seg[1]
            else:
                row += [ENV] * seg[1]
                act += [False] * seg[1]
                idx += [0] * seg[1]
        ids.append(row), acted.append(act), index.append(idx), turns.append(k)
    width = max(len(r) for r in ids)
    pad = lambda rows, v: torch.tensor([r + [v] * (width - len(r)) for r in rows])  # noqa: E731
    n = len(EPISODES)
    context = pad([[True] * len(r) for r in ids], False)
    log = EpisodeLog(torch.tensor(turns), torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                     torch.zeros(n), torch.zeros(n, dtype=torch.long), 0.0, torch.zeros(n, width), 0, None,
                     pad(index, 0))
    return Samples(({},) * n, torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool), pad(ids, PAD),
                   pad(acted, False), 1, torch.arange(n), ("",) * n, context_mask=context, episodes=log)


def test_an_episode_is_judged_by_its_last_turn() -> None:
    """L_max = 8, buffer 0.2 (the dapo preset): L_cache = 1.6, the penalty starts above 8 − 1.6 = 6.4 tokens:
    R(|y|) = −clamp((|y| − 6.4) / 1.6, 0, 1).
      0: last turn 6 → 0 (summed over turns, 8 + 6 = 14, it was −1: a right tool episode scored as a wrong answer)
      1: 6 → 0
      2: last turn 3 → 0 (summed 9: −1)
      3: its last turn has no stop token: cut, judged as L_max = 8 → −1, and truncated (summed 5 < 8: neither)
      4: last turn 7 → −(7 − 6.4) / 1.6 = −0.375 (summed 11: −1; two model turns with nothing between them)
      5: cut at L_max → −1, truncated (as before)"""
    samples = _episodes()
    config = load_config(overrides={"algo": "dapo", "rollout.max_new_tokens": 8})
    assert config.reward.overlong_buffer == 0.2 and config.update.mask_truncated
    cut = truncated_rows(samples, (STOP,), 8)
    assert cut.tolist() == [False, False, False, True, False, True]
    rewards = torch.zeros(samples.response_ids.shape)
    shaped, trained, stats = apply_overlong(samples, rewards, config, (STOP,))
    penalty = [0.0, 0.0, 0.0, -1.0, -0.375, -1.0]
    close(shaped.sum(-1), penalty)
    for i, at in enumerate([18, 5, 12, 5, 10, 7]):  # each episode's last model token: 8+5+6−1, 6−1, …
        assert shaped[i, at] == shaped[i].sum()  # on the last model token, where the score is
    assert trained is not None and not trained[3].any() and not trained[5].any()
    assert torch.equal(trained[[0, 1, 2, 4]], samples.response_mask[[0, 1, 2, 4]])
    close(torch.tensor(stats["truncated_frac"]), 2 / 6)
    close(torch.tensor(stats["overlong_penalty"]), sum(penalty) / 6)
    # the filter of dynamic sampling sees the same penalty (score 1 each)
    close(sequence_rewards(samples, torch.ones(6), config, (STOP,)), [1 + p for p in penalty])


def test_one_turn_rows_are_judged_as_before() -> None:
    """Without episodes nothing changes: |y| = 8, 9, 10 at L_max 10, buffer 0.2 → 0, −0.5, −1 and only the
    10-token row without a stop token is truncated."""
    lengths, stops = [8, 9, 10, 10], [True, True, False, True]
    ids = torch.tensor([[TOK] * (n - 1) + [STOP if s else TOK] + [PAD] * (10 - n) for n, s in zip(lengths, stops)])
    mask = torch.tensor([[t < n for t in range(10)] for n in lengths])
    samples = Samples(({},) * 4, torch.ones(4, 1, dtype=torch.long), torch.ones(4, 1, dtype=torch.bool), ids, mask, 1,
                      torch.arange(4), ("",) * 4)
    config = load_config(overrides={"algo": "dapo", "rollout.max_new_tokens": 10})
    shaped, trained, _ = apply_overlong(samples, torch.zeros(4, 10), config, (STOP,))
    close(shaped.sum(-1), [0.0, -0.5, -1.0, -1.0])
    assert truncated_rows(samples, (STOP,), 10).tolist() == [False, False, True, False]
