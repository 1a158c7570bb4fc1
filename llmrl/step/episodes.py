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
single-turn key itself (`turn_keys`). The completion scored by the task's reward is the last turn's
text; the environment's per-turn rewards are summed in `EpisodeLog.env_reward`.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from ..config.schema import RolloutConfig
from ..engines.base import GenerationEngine, SamplingSettings, row_keys
from ..engines.turns import left_pad, open_turns
from ..envs import EnvSpec, EnvStep, call_format, env_turn_ids, offered_tools, parse_calls, prompt_ids, run_with_limit
from ..errors import RunFailed
from .records import EpisodeLog, Samples

_TURN_MIX = 1_000_000_007


class EnvFailed(RunFailed):
    """The environment misbehaved (raised, returned the wrong type) before any update of the step."""

    consistent = True


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


def _call(spec: EnvSpec, what: str, fn: Any, episode: int, timeout_s: float) -> Any:
    """`fn()` (the environment's reset or step) under `timeout_s`; whatever it does wrong (raises, hangs)
    stops the run in one sentence naming the environment and the episode."""
    out, error = run_with_limit(fn, {}, timeout_s)
    if error is not None:  # the user's environment: report it, never a traceback
        where = " in reset" if what == "reset" else ""
        raise EnvFailed(f"Environment '{spec.name}' {error}{where} (episode {episode}).")
    return out


def _checked_step(spec: EnvSpec, env: Any, episode: int, text: str, calls: list, timeout_s: float) -> EnvStep:
    """env.step under the time limit, its answer checked."""
    out = _call(spec, "step", lambda: env.step(text, calls), episode, timeout_s)
    if not isinstance(out, EnvStep):
        raise EnvFailed(f"Environment '{spec.name}' returned a {type(out).__name__} from step, not an EnvStep "
                        f"(episode {episode}).")
    return out


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
    KV cache); False sends every turn as a fresh request (bench/turn_cache.py compares the two)."""
    g, pad = cfg.num_generations, tokenizer.pad_token_id
    index = prompt_index.repeat_interleave(g)
    keys = row_keys(seed, step, index, torch.arange(first_sample, first_sample + g).repeat(len(rows)))
    n, fmt = len(index), call_format(tokenizer, cfg.tool_format)
    envs, prompts, tools = [], [], None
    for i in range(n):
        env = spec.make()
        opening = _call(spec, "reset", lambda: env.reset(rows[i // g], int(keys[i])), i, cfg.env_timeout_s)
        tools = offered_tools(env)
        envs.append(env)
        prompts.append(prompt_ids(tokenizer, opening, tools, fmt))
    ids: list[list[int]] = [[] for _ in range(n)]
    acted: list[list[bool]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    last_text, done = [""] * n, [False] * n
    turns, calls_n, errors_n, env_tokens = [0] * n, [0] * n, [0] * n, [0] * n
    env_reward, env_time, lp_dtype = [0.0] * n, 0.0, torch.float32
    turn_rewards: list[list[tuple[int, float]]] = [[] for _ in range(n)]  # (the turn's last token, its reward)
    slots = 0  # Σ_turns live episodes × the turn's longest sampled run
    caps = [min(x for x in (cfg.max_episode_tokens, None if context is None else context - len(p)) if x is not None)
            if cfg.max_episode_tokens is not None or context is not None else None for p in prompts]
    decoder = open_turns(engine, pad, role, reuse_cache)
    for turn in range(cfg.max_turns):
        live = [i for i in range(n) if not done[i] and (caps[i] is None or len(ids[i]) < caps[i])]
        if not live:
            break
        room = {i: cfg.max_new_tokens if caps[i] is None else min(cfg.max_new_tokens, caps[i] - len(ids[i])) for i in live}
        settings = SamplingSettings(max(room.values()), cfg.temperature, cfg.top_p)
        gen = decoder.turn(live, [prompts[i] + ids[i] for i in live], settings,
                           None if greedy else turn_keys(keys[live], turn), logprobs=logprobs,
                           room=torch.tensor([room[i] for i in live], dtype=torch.long))
        slots += len(live) * min(int(gen.response_mask.sum(-1).max()), max(room.values()))
        for j, i in enumerate(live):
            sampled = gen.response_ids[j][gen.response_mask[j]].tolist()[: room[i]]
            ids[i] += sampled
            acted[i] += [True] * len(sampled)
            if gen.logprobs is not None:
                lp_dtype = gen.logprobs.dtype
                lps[i] += gen.logprobs[j][gen.response_mask[j]].tolist()[: room[i]]
            turns[i] += 1
            last_text[i] = tokenizer.decode(sampled, skip_special_tokens=True)
            stopped = bool(sampled) and sampled[-1] in stop_ids
            started = time.perf_counter()
            out = _checked_step(spec, envs[i], i, last_text[i],
                                parse_calls(tokenizer.decode(sampled[:-1] if stopped else sampled,
                                                             skip_special_tokens=False), fmt), cfg.env_timeout_s)
            env_time += time.perf_counter() - started
            env_reward[i] += float(out.reward)
            turn_rewards[i].append((len(ids[i]) - 1, float(out.reward)))
            calls_n[i] += out.tool_calls
            errors_n[i] += out.tool_errors
            # the environment sees every turn (its reward counts); its answer only when the model may act again
            budget = caps[i]
            if out.done or not stopped or turn == cfg.max_turns - 1 or (budget is not None and len(ids[i]) >= budget):
                done[i] = True
                continue
            try:
                answer = env_turn_ids(tokenizer, out.messages, tools, tokenizer.decode(sampled[-1:]))
            except Exception as exc:  # the template refuses the messages (a role it does not know, …)
                raise EnvFailed(f"The chat template cannot render the answer of environment '{spec.name}' "
                                f"({type(exc).__name__}: {str(exc).rstrip('.')}) (episode {i}).") from exc
            if budget is not None and len(ids[i]) + len(answer) >= budget:
                done[i] = True  # no room left for the model to act on the answer
                continue
            ids[i] += answer
            acted[i] += [False] * len(answer)
            lps[i] += [0.0] * len(answer)
            env_tokens[i] += len(answer)
    p_ids, p_mask = left_pad(prompts, pad)
    action = right_pad(acted, False, torch.bool)
    context = right_pad([[True] * len(r) for r in ids], False, torch.bool)
    early = right_pad([[0.0] * len(r) for r in ids], 0.0, torch.float32)
    for i, rewarded in enumerate(turn_rewards):
        for at, r in rewarded[:-1]:  # every turn but the last (its reward stays in the score)
            if at >= 0 and r and acted[i][at]:  # a turn that sampled nothing keeps its reward in the score
                early[i, at] += r
    log = EpisodeLog(torch.tensor(turns), torch.tensor(calls_n), torch.tensor(errors_n),
                     torch.tensor(env_reward, dtype=torch.float32), torch.tensor(env_tokens), env_time,
                     early.to(device), slots)
    return Samples(
        rows=tuple(rows), prompt_ids=p_ids.to(device), prompt_mask=p_mask.to(device),
        response_ids=right_pad(ids, pad, torch.long).to(device), response_mask=action.to(device), group_size=g,
        prompt_index=index.to(device), completions=tuple(last_text),
        behaviour_logprobs=right_pad(lps, 0.0, lp_dtype).to(device) if logprobs else None,
        context_mask=context.to(device), episodes=log,
    )


def episode_stats(samples: Samples) -> dict[str, float]:
    """The step's episode metrics: turns_mean, tool_calls_per_episode, tool_error_rate (failed calls /
    calls), episode_tokens (response tokens per episode, the model's and the environment's),
    masked_token_frac (the environment's share of them), env_reward_mean, env_time_s, and
    decode_idle_share = 1 − (the model's tokens) / (decode slots): the share of the engine's decoding
    spent on rows of a turn's batch that had already stopped while its longest answer went on. An
    episode that ended leaves the batch at the next turn, so finished episodes cost no slot."""
    log = samples.episodes
    assert log is not None and samples.context_mask is not None
    calls, real = float(log.tool_calls.sum()), float(samples.context_mask.sum())
    acted = float(samples.response_mask.sum())
    return {"turns_mean": log.turns.float().mean().item(), "tool_calls_per_episode": calls / samples.n,
            "tool_error_rate": float(log.tool_errors.sum()) / calls if calls else 0.0,
            "episode_tokens": real / samples.n, "masked_token_frac": float(log.env_tokens.sum()) / real if real else 0.0,
            "env_reward_mean": log.env_reward.mean().item(), "env_time_s": log.env_time_s,
            "decode_idle_share": 1.0 - acted / log.decode_slots if log.decode_slots else 0.0}


def episode_view(tokenizer: PreTrainedTokenizerBase, samples: Samples, i: int) -> dict[str, Any]:
    """Row i's episode for completions.jsonl: {turns: [{by: 'model'|'env', text, tokens, trained}] in
    order (the runs of the action mask over the row's real tokens, decoded with their special tokens;
    a model turn also has `reward`, the environment's reward for it), tool_calls, tool_errors, env_reward}."""
    log, context = samples.episodes, samples.context_mask
    assert log is not None and context is not None
    ids = samples.response_ids[i][context[i]].tolist()
    acted = samples.response_mask[i][context[i]].tolist()
    early = None if log.early_rewards is None else log.early_rewards[i][context[i]].tolist()
    turns: list[dict[str, Any]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or acted[end] != acted[start]:
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
