"""generate, episode-aware: B dataset rows → `Samples` whose rows are whole episodes (rollout.env).

Each of the N = B·G episodes starts from `env.reset(row, key)`; every turn, the engine continues
all unfinished episodes at once from their token ids so far (`engines/turns.py`: the `hf` engine
from each episode's KV cache, prefilling only what the last turn added), and the environment
answers each turn:

    row ids   = prompt ids + turn₁'s sampled ids + env₁ ids + turn₂'s sampled ids + …
    response_mask (the action mask) = 1 on the sampled ids only; context_mask = 1 on all of them

Token in, token out: a turn's ids are appended exactly as the engine sampled them (its stop token
included), the environment's messages as `envs.render.env_turn_ids` tokenizes them alone; the
conversation is never re-rendered and re-tokenized, so log π and log π_old are of the very sequence
that was sampled. The environment answers every turn (its reward counts); the episode ends when it
says done, after `rollout.max_turns` turns, at `rollout.max_episode_tokens` response tokens (a turn
is cut there), or when a turn ends without a stop token (cut at max_new_tokens), and then its answer
is not appended. Turn k of a row is keyed by (its row key, k): turn 0 uses the
single-turn key itself (`turn_keys`). `reset` gets the row's game key (`game_keys`: the key of the
row's sample 0), the same for its G episodes, so they play one game and a group estimator compares
like with like; an environment that sets `seed_per_episode = True` gets each episode's own key.
The completion scored by the task's reward is the last turn's text; the environment's per-turn
rewards are summed in `EpisodeLog.env_reward`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from ..config.schema import RolloutConfig
from ..engines.base import GenerationEngine, SamplingSettings, row_keys
from ..engines.turns import left_pad, open_turns
from ..envs import EnvSpec, EnvStep, call_format, env_turn_ids, parse_calls, prompt_ids, run_with_limit
from ..envs.checks import F32_MAX, build, call_tools, check_opening, check_step, check_tools
from ..errors import PluginError
from .records import EpisodeLog, Samples

_TURN_MIX = 1_000_000_007


class EnvFailed(PluginError):
    """The environment misbehaved (raised, hung, returned what its contract does not allow: envs/checks.py)
    before any update of the step."""


def turn_keys(keys: Tensor, turn: int) -> Tensor:
    """(N,) seed keys of turn `turn`: the row keys themselves at turn 0, else (key + turn·(10^9+7)) mod (2^63 − 1)."""
    if turn == 0:
        return keys
    return torch.tensor([(k + turn * _TURN_MIX) % (2**63 - 1) for k in keys.tolist()], dtype=torch.long)


def episode_budget(cfg: RolloutConfig) -> int:
    """The response tokens (the model's and the environment's) an engine reserves room for per episode:
    rollout.max_episode_tokens, else 2 × max_turns × max_new_tokens (the environment's answers
    guessed as long as the model's turns). It sizes the vllm engine's context and KV cache; an episode
    that outgrows the context ends there (`generate_episodes`' `context`), as at the model's window."""
    return cfg.max_episode_tokens or 2 * cfg.max_turns * cfg.max_new_tokens


def right_pad(rows: Sequence[list[Any]], fill: Any, dtype: torch.dtype) -> Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=dtype)


def _call(spec: EnvSpec, what: str, fn: Any, episode: int, timeout_s: float, turn: int = 0) -> Any:
    """`fn()` (the environment's reset or step) under `timeout_s`; whatever it does wrong (raises, hangs,
    a tool's result refused inside it) stops the run in one sentence naming the environment and the episode."""
    try:
        out, error = run_with_limit(fn, {}, timeout_s)
    except PluginError as exc:  # a tool's result (envs/checks.tool_text), raised inside the environment's step
        raise EnvFailed(f"{str(exc).rstrip('.')} (environment '{spec.name}', episode {episode}, turn {turn}).") from None
    if error is not None:  # the user's environment: report it, never a traceback
        where = " in reset" if what == "reset" else ""
        raise EnvFailed(f"Environment '{spec.name}' {error}{where} (episode {episode}).")
    return out


def _checked_step(spec: EnvSpec, env: Any, episode: int, turn: int, text: str, calls: list,
                  timeout_s: float) -> EnvStep:
    """env.step under the time limit, its answer checked (envs/checks.check_step)."""
    out = _call(spec, "step", lambda: env.step(text, calls), episode, timeout_s, turn)
    return _named(lambda: check_step(spec.name, out, episode, turn))


def _named(check: Any) -> Any:
    """`check()`, its PluginError raised as an EnvFailed (the same sentence)."""
    try:
        return check()
    except PluginError as exc:
        raise EnvFailed(str(exc)) from None


@dataclass
class Episode:
    """One episode as it grows: its environment, prompt ids and cap (the response tokens it may reach:
    rollout.max_episode_tokens and the context, None for no cap); the row's ids so far, which of them the
    model sampled (`acted`) and their log-probs (0 at the environment's), the last turn's text, and
    counts. `rewards`: (the turn's last token, the environment's reward for it) per turn."""

    env: Any
    prompt: list[int]
    cap: int | None
    ids: list[int] = field(default_factory=list)
    acted: list[bool] = field(default_factory=list)
    turn_of: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    last_text: str = ""
    done: bool = False
    turns: int = 0
    calls: int = 0
    errors: int = 0
    env_tokens: int = 0
    env_reward: float = 0.0
    rewards: list[tuple[int, float]] = field(default_factory=list)
    made: list[Any] = field(default_factory=list)  # the tool calls made so far (ToolCall)
    repeats: int = 0  # turns whose every call repeats one made before (e.g. an answer quoting its call)

    def playing(self) -> bool:
        return not self.done and (self.cap is None or len(self.ids) < self.cap)

    def room(self, max_new_tokens: int) -> int:
        """The tokens its next turn may take: max_new_tokens, or less near its cap."""
        return max_new_tokens if self.cap is None else min(max_new_tokens, self.cap - len(self.ids))

    def append(self, ids: list[int], acted: bool, lps: list[float] | None, turn: int = 0) -> None:
        """Add `ids`: the model's turn `turn` (1-based) when `acted`, else the environment's answer (turn 0)."""
        self.ids += ids
        self.acted += [acted] * len(ids)
        self.turn_of += [turn] * len(ids)
        if lps is not None:
            self.lps += lps


def _cap(cfg: RolloutConfig, prompt: list[int], context: int | None) -> int | None:
    """The smaller of rollout.max_episode_tokens and the context left after the prompt; None if neither is set."""
    if cfg.max_episode_tokens is None and context is None:
        return None
    return min(x for x in (cfg.max_episode_tokens, None if context is None else context - len(prompt)) if x is not None)


def game_keys(seed: int, step: int, index: Tensor) -> Tensor:
    """(N,) the `reset` seeds of episodes whose rows are `index` (N,): the key of each row's sample 0,
    (seed, step, row, 0), whatever the episode's own sample, so a row's G episodes play one game."""
    return row_keys(seed, step, index, torch.zeros_like(index))


def _start(spec: EnvSpec, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]], keys: Tensor,
           games: Tensor, g: int, cfg: RolloutConfig, fmt: str, context: int | None) -> tuple[list[Episode], Any]:
    """Episode i = `spec.make()` reset on row i // g with the row's game key `games[i]` (its own key `keys[i]`
    when the environment sets `seed_per_episode`), its opening rendered with the tools it offers."""
    episodes, tools = [], None
    for i in range(len(keys)):
        env = _named(lambda: build(spec, i))
        seed = int(keys[i] if getattr(env, "seed_per_episode", False) else games[i])
        opening = _call(spec, "reset", lambda: env.reset(rows[i // g], seed), i, cfg.env_timeout_s)
        opening = _named(lambda: check_opening(spec.name, opening, i))
        tools = _named(lambda: check_tools(spec.name, call_tools(spec.name, env, episode=i), episode=i))
        prompt = prompt_ids(tokenizer, opening, tools, fmt)
        episodes.append(Episode(env, prompt, _cap(cfg, prompt, context)))
    return episodes, tools


def _answer(spec: EnvSpec, tokenizer: PreTrainedTokenizerBase, ep: Episode, i: int, sampled: list[int],
            cfg: RolloutConfig, last_turn: bool, stop_ids: Sequence[int], fmt: str, tools: Any) -> float:
    """The environment's step on episode i's turn `sampled` (already appended): its reward and counts, and
    its answer appended when the model may act again, else the episode ends. Returns the seconds in `step`."""
    stopped = bool(sampled) and sampled[-1] in stop_ids
    # a turn cut before its stop token is unfinished: it calls nothing (a call cut mid-way is no tool error)
    calls = parse_calls(tokenizer.decode(sampled[:-1], skip_special_tokens=False), fmt) if stopped else []
    ep.repeats += bool(calls) and all(c in ep.made for c in calls)  # the json format reads a quoted call as a call
    ep.made += calls
    started = time.perf_counter()
    out = _checked_step(spec, ep.env, i, ep.turns, ep.last_text, calls, cfg.env_timeout_s)
    seconds = time.perf_counter() - started
    ep.env_reward += float(out.reward)
    if abs(ep.env_reward) > F32_MAX:  # each turn's reward is within float32's range (check_step), their sum may not be
        raise EnvFailed(f"Environment '{spec.name}' returned rewards that sum to {ep.env_reward:g} over the turns of "
                        f"episode {i} (turn {ep.turns}), beyond the float32 range (|r| ≤ {F32_MAX:.4g}) rewards are "
                        "trained in; scale them down.")
    ep.rewards.append((len(ep.ids) - 1, float(out.reward)))
    ep.calls += out.tool_calls
    ep.errors += out.tool_errors
    # the environment sees every turn (its reward counts); its answer only when the model may act again
    if out.done or not stopped or last_turn or (ep.cap is not None and len(ep.ids) >= ep.cap):
        ep.done = True
        return seconds
    try:
        answer = env_turn_ids(tokenizer, out.messages, tools, tokenizer.decode(sampled[-1:]))
    except Exception as exc:  # the template refuses the messages (a role it does not know, …)
        raise EnvFailed(f"The chat template cannot render the answer of environment '{spec.name}' "
                        f"({type(exc).__name__}: {str(exc).rstrip('.')}) (episode {i}).") from exc
    if ep.cap is not None and len(ep.ids) + len(answer) >= ep.cap:
        ep.done = True  # no room left for the model to act on the answer
        return seconds
    ep.append(answer, False, [0.0] * len(answer))
    ep.env_tokens += len(answer)
    return seconds


@torch.no_grad()
def generate_episodes(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, spec: EnvSpec,
                      rows: Sequence[dict[str, Any]], prompt_index: Tensor, *, cfg: RolloutConfig, seed: int, step: int,
                      device: torch.device, stop_ids: Sequence[int], logprobs: bool = False,
                      first_sample: int = 0, context: int | None = None, greedy: bool = False,
                      role: str = "actor", reuse_cache: bool = True) -> Samples:
    """G = cfg.num_generations episodes from each of the B `rows` (arguments as `generate.generate`).
    `context`: the model's context window; an episode also ends where prompt + response would pass it.
    `greedy`: every turn decoded greedily (evaluation; the keys still seed `reset`). `role`: the policy
    that acts ('reference': the plain model, `llmrl eval` of a model). `reuse_cache`: continue each turn
    from the engine's own turn decoder when it has one (`engines/turns.open_turns`: the `hf` engine's
    KV cache); False sends every turn as a fresh request (ae998e2:bench/probes/turn_cache.py compares the two)."""
    g = cfg.num_generations
    index = prompt_index.repeat_interleave(g)
    keys = row_keys(seed, step, index, torch.arange(first_sample, first_sample + g).repeat(len(rows)))
    fmt = call_format(tokenizer, cfg.tool_format)
    episodes, tools = _start(spec, tokenizer, rows, keys, game_keys(seed, step, index), g, cfg, fmt, context)
    decoder = open_turns(engine, tokenizer.pad_token_id, role, reuse_cache)
    slots, env_time, lp_dtype = 0, 0.0, torch.float32  # slots: Σ_turns live episodes × the turn's longest sampled run
    for turn in range(cfg.max_turns):
        live = [i for i, ep in enumerate(episodes) if ep.playing()]
        if not live:
            break
        room = [episodes[i].room(cfg.max_new_tokens) for i in live]
        settings = SamplingSettings(max(room), cfg.temperature, cfg.top_p)
        gen = decoder.turn(live, [episodes[i].prompt + episodes[i].ids for i in live], settings,
                           None if greedy else turn_keys(keys[live], turn), logprobs=logprobs,
                           room=torch.tensor(room, dtype=torch.long))
        slots += len(live) * min(int(gen.response_mask.sum(-1).max()), max(room))
        for j, i in enumerate(live):
            ep, mask = episodes[i], gen.response_mask[j]
            sampled = gen.response_ids[j][mask].tolist()[: room[j]]
            if gen.logprobs is not None:
                lp_dtype = gen.logprobs.dtype
            ep.append(sampled, True, None if gen.logprobs is None else gen.logprobs[j][mask].tolist()[: room[j]],
                      turn + 1)
            ep.turns += 1
            ep.last_text = tokenizer.decode(sampled, skip_special_tokens=True)
            env_time += _answer(spec, tokenizer, ep, i, sampled, cfg, turn == cfg.max_turns - 1, stop_ids, fmt, tools)
    return _samples(episodes, rows, index, g, tokenizer.pad_token_id, device, logprobs, lp_dtype, env_time, slots,
                    cfg.max_turns)


def _samples(episodes: list[Episode], rows: Sequence[dict[str, Any]], index: Tensor, g: int, pad: int,
             device: torch.device, logprobs: bool, lp_dtype: torch.dtype, env_time: float, slots: int,
             max_turns: int) -> Samples:
    """The episodes as a `Samples` record: rows right-padded, the action and context masks, the EpisodeLog."""
    acted = [ep.acted for ep in episodes]
    p_ids, p_mask = left_pad([ep.prompt for ep in episodes], pad)
    context = right_pad([[True] * len(ep.ids) for ep in episodes], False, torch.bool)
    early = right_pad([[0.0] * len(ep.ids) for ep in episodes], 0.0, torch.float32)
    for i, ep in enumerate(episodes):
        for at, r in ep.rewards[:-1]:  # every turn but the last (its reward stays in the score)
            if at >= 0 and r and acted[i][at]:  # a turn that sampled nothing keeps its reward in the score
                early[i, at] += r
    log = EpisodeLog(torch.tensor([ep.turns for ep in episodes]), torch.tensor([ep.calls for ep in episodes]),
                     torch.tensor([ep.errors for ep in episodes]),
                     torch.tensor([ep.env_reward for ep in episodes], dtype=torch.float32),
                     torch.tensor([ep.env_tokens for ep in episodes]), env_time, early.to(device), slots,
                     torch.tensor([[r for _, r in ep.rewards] + [float("nan")] * (max_turns - len(ep.rewards))
                                   for ep in episodes], dtype=torch.float32),
                     right_pad([ep.turn_of for ep in episodes], 0, torch.long).to(device),
                     torch.tensor([ep.repeats for ep in episodes]))
    return Samples(
        rows=tuple(rows), prompt_ids=p_ids.to(device), prompt_mask=p_mask.to(device),
        response_ids=right_pad([ep.ids for ep in episodes], pad, torch.long).to(device),
        response_mask=right_pad(acted, False, torch.bool).to(device), group_size=g,
        prompt_index=index.to(device), completions=tuple(ep.last_text for ep in episodes),
        behaviour_logprobs=right_pad([ep.lps for ep in episodes], 0.0, lp_dtype).to(device) if logprobs else None,
        context_mask=context.to(device), episodes=log,
    )


def episode_stats(samples: Samples) -> dict[str, float | None]:
    """The step's episode metrics: turns_mean, tool_calls_per_episode, tool_error_rate (failed calls /
    calls), episode_tokens (response tokens per episode, the model's and the environment's),
    masked_token_frac (the environment's share of them), env_reward_mean, env_time_s, and
    decode_idle_share = 1 − (the model's tokens) / (decode slots): the share of a turn's rows × steps
    (its batch until its longest answer ends) whose row had already stopped: episodes waiting for the
    turn's end (the `hf` engine no longer computes them: its finished rows leave the decoding batch).
    An episode that ended leaves the batch at the next turn, so finished episodes cost no slot.
    repeated_call_share = (turns whose every call repeats one the episode made before) / turns: in the json
    format an untagged {"name", "arguments"} object is a call, so an answer that quotes its earlier call
    continues the episode instead of being scored (docs/environments.md).
    `env_reward_turn{k}`, k = 1 … rollout.max_turns: the environment's mean reward for turn k over the
    episodes that took it (None when none did)."""
    log = samples.episodes
    assert log is not None and samples.context_mask is not None
    calls, real = float(log.tool_calls.sum()), float(samples.context_mask.sum())
    acted = float(samples.response_mask.sum())
    return {"turns_mean": log.turns.float().mean().item(), "tool_calls_per_episode": calls / samples.n,
            "tool_error_rate": float(log.tool_errors.sum()) / calls if calls else 0.0,
            "episode_tokens": real / samples.n, "masked_token_frac": float(log.env_tokens.sum()) / real if real else 0.0,
            "env_reward_mean": log.env_reward.mean().item(), "env_time_s": log.env_time_s,
            "decode_idle_share": 1.0 - acted / log.decode_slots if log.decode_slots else 0.0,
            "repeated_call_share": _share(log.repeated_calls, log.turns), **_per_turn(log)}


def _share(part: Tensor | None, whole: Tensor) -> float:
    """Σ part / Σ whole over the episodes (0 when whole sums to 0 or part is not logged)."""
    total = float(whole.sum())
    return float(part.sum()) / total if part is not None and total else 0.0


def _per_turn(log: EpisodeLog) -> dict[str, float | None]:
    """{env_reward_turn{k}: the mean of column k−1 of log.turn_rewards over its non-NaN entries, or None}."""
    if log.turn_rewards is None:
        return {}
    out: dict[str, float | None] = {}
    for k, column in enumerate(log.turn_rewards.unbind(1), start=1):
        taken = column[~column.isnan()]
        out[f"env_reward_turn{k}"] = taken.mean().item() if len(taken) else None
    return out


def episode_view(tokenizer: PreTrainedTokenizerBase, samples: Samples, i: int) -> dict[str, Any]:
    """Row i's episode for completions.jsonl: {turns: [{by: 'model'|'env', text, tokens, trained}] in
    order (the runs of the action mask over the row's real tokens, decoded with their special tokens;
    a model turn also has `reward`, the environment's reward for it), tool_calls, tool_errors, env_reward}."""
    log, context = samples.episodes, samples.context_mask
    assert log is not None and context is not None
    ids = samples.response_ids[i][context[i]].tolist()
    acted = samples.response_mask[i][context[i]].tolist()
    early = None if log.early_rewards is None else log.early_rewards[i][context[i]].tolist()
    # a run ends where the action mask or the model's turn number changes (two model turns meet where the
    # environment's answer between them is empty)
    part = acted if log.turn_index is None else list(zip(acted, log.turn_index[i][context[i]].tolist()))
    turns: list[dict[str, Any]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or part[end] != part[start]:
            turns.append({"by": "model" if acted[start] else "env", "text": tokenizer.decode(ids[start:end]),
                          "tokens": end - start, "trained": bool(acted[start])})
            if acted[start]:
                turns[-1]["reward"] = early[end - 1] if early is not None else 0.0
            start = end
    model_turns = [t for t in turns if t["by"] == "model"]
    if model_turns:  # the last turn's reward: the episode's total less the earlier turns'
        model_turns[-1]["reward"] = float(log.env_reward[i]) - sum(t["reward"] for t in model_turns[:-1])
    return {"turns": turns, "tool_calls": int(log.tool_calls[i]), "tool_errors": int(log.tool_errors[i]),
            "env_reward": float(log.env_reward[i])}
