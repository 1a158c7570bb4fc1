"""Length buckets: a batch's rows run in groups of like length, each trimmed of the padding it shares.

A batch is laid out as one (N, P+T) block (`stack.Sequences`): prompts left-padded to the longest
prompt P, responses right-padded to the longest response T. Every padded position still costs a full
position in each linear layer of each forward and backward, and in a sampled batch the longest
response is often several times the typical one (one row that never stops sets T for all). Rows
sorted by response length and cut into contiguous groups b, each run as its own block of
n_b × (P_b + T_b) positions (P_b, T_b the longest prompt and response *in the group*), cost

    Σ_b n_b · (P_b + T_b) + C · (number of groups)

positions, where C stands for a forward call's fixed cost (kernel launches, Python) in positions.
`plan` finds the cut that minimises it exactly (dynamic programming over the sorted rows); a single
group spanning the whole batch is the batch as laid out, run unchanged.

Each row's hidden states are the same as in the full block up to float rounding: the trimmed
columns are padding its attention never reads, and its positions are carried over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..ops import last_token_index
from .sequences import Sequences

MIN_CALL_POSITIONS = 64
"""C's floor: a group must save at least this many positions to be worth its own forward call
(at 64 positions the products of a 0.5B model are still near their peak rate on a CPU)."""

LAYER_CALL_S = 3e-4
"""A decoder layer's fixed cost per forward and backward call, in seconds (its ~20 kernel launches and
their Python), whatever its width."""

RATE = {"cpu": 5e10, "cuda": 1e14}
"""Products' rate, FLOP/s, that a position's work runs at (a 2-core CPU's float32 order of magnitude;
a datacenter GPU's); only the ratio to LAYER_CALL_S matters."""


@dataclass(frozen=True)
class Group:
    """Rows (n_b,) of the batch (in its order), run as columns [P − p_b, P + t_b) of the block."""

    rows: Tensor
    prompt: int  # p_b: the longest prompt of the group
    response: int  # t_b: the longest response of the group (at least 1)


def call_positions(layers: int, body_params: int, device: str) -> float:
    """C of the module's cost: a forward call's fixed cost in positions of the model's work,
    layers · LAYER_CALL_S / (2 · body_params / rate), at least MIN_CALL_POSITIONS. Qwen2.5-0.5B
    (24 layers, 358 M body parameters) on a CPU: 64 (the floor; 0.5 from the formula); on a GPU ≈ 10³."""
    per_position = 2 * max(body_params, 1) / RATE.get(device, RATE["cuda"])
    return max(float(MIN_CALL_POSITIONS), layers * LAYER_CALL_S / per_position)


def model_call_positions(model: nn.Module) -> float:
    """`call_positions` of a causal LM on its device (body: the decoder without its input embedding)."""
    body = sum(p.numel() for p in model.get_decoder().parameters()) - model.get_input_embeddings().weight.numel()
    return call_positions(model.config.get_text_config().num_hidden_layers, body, model.device.type)


def extents(attention: Tensor, prompt_len: int) -> tuple[list[int], list[int]]:
    """Per row, the real prompt length (left padding excluded) and the response extent (up to and
    including its last attended position; an episode's environment tokens count), as lists."""
    prompt = attention[:, :prompt_len].sum(-1)
    response = attention[:, prompt_len:]
    ends = torch.where(response.any(-1), last_token_index(response.bool()) + 1, torch.zeros_like(prompt))
    return prompt.tolist(), ends.tolist()


def plan(prompts: list[int], responses: list[int], call_cost: float, most_runs: int = 64) -> list[Group]:
    """The grouping of rows that minimises Σ n_b (p_b + t_b) + call_cost · groups (see the module).

    prompts, responses: per row, as from `extents`. Rows sorted by response length form runs of
    equal length (at most `most_runs`: beyond that, runs of like length are joined); a group is a
    contiguous span of runs, found by dynamic programming over the runs, O(runs²)."""
    order = sorted(range(len(prompts)), key=lambda i: (responses[i], prompts[i]))
    runs = _runs([responses[i] for i in order], most_runs)  # [start, end) spans of `order`
    best = [0.0] + [float("inf")] * len(runs)  # best[j]: least cost of the first j runs
    cut = [0] * (len(runs) + 1)
    for j in range(1, len(runs) + 1):
        longest = max(1, responses[order[runs[j - 1][1] - 1]])
        longest_prompt = 0
        for i in range(j - 1, -1, -1):  # group = runs i .. j-1
            longest_prompt = max([longest_prompt] + [prompts[r] for r in order[runs[i][0]:runs[i][1]]])
            rows = runs[j - 1][1] - runs[i][0]
            cost = best[i] + rows * (max(1, longest_prompt) + longest) + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(runs)
    while j > 0:
        i = cut[j]
        rows = sorted(order[runs[i][0]:runs[j - 1][1]])
        groups.append(Group(torch.tensor(rows, dtype=torch.long), max(1, max(prompts[r] for r in rows)),
                            max(1, max(responses[r] for r in rows))))
        j = i
    return groups[::-1]


def _runs(lengths: list[int], most: int) -> list[tuple[int, int]]:
    """[start, end) spans of equal values in the sorted `lengths`; more than `most` spans are joined
    into `most` spans of about equal row counts (each ends where a value ends)."""
    spans, start = [], 0
    for k in range(1, len(lengths) + 1):
        if k == len(lengths) or lengths[k] != lengths[start]:
            spans.append((start, k))
            start = k
    if len(spans) <= most:
        return spans
    per = len(lengths) / most
    joined, start = [], 0
    for s, e in spans:
        if e >= per * (len(joined) + 1) or e == len(lengths):
            joined.append((start, e))
            start = e
    return joined


def bucketed(run: Callable[[Sequences], Tensor], seq: Sequences, call_cost: float) -> Tensor | None:
    """Hidden states at the positions that predict the response tokens, (N, T, H), with the rows
    run in the groups of `plan`; None when one group is best (the caller runs the batch as is).

    `run(block)` → (n, t, H): the hidden states predicting a block's t response tokens. Each group's
    (n_b, t_b, H) is padded with zeros to T (positions no mask reads)."""
    ids, attention, positions, p = seq.ids, seq.attention, seq.positions, seq.prompt_len
    t = ids.shape[1] - p
    prompts, responses = extents(attention, p)
    groups = plan(prompts, responses, call_cost)
    if len(groups) == 1:
        return None
    parts, order = [], []
    for g in groups:
        cols = slice(p - g.prompt, p + g.response)
        h = run(Sequences(ids[g.rows, cols], attention[g.rows, cols], positions[g.rows, cols], g.prompt))
        parts.append(F.pad(h, (0, 0, 0, t - g.response)))
        order.append(g.rows)
    inverse = torch.empty(ids.shape[0], dtype=torch.long)
    inverse[torch.cat(order)] = torch.arange(ids.shape[0])
    return torch.cat(parts)[inverse.to(ids.device)]
