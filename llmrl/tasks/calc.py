"""Multi-digit multiplication with a calculator tool (the built-in `calculator` environment).

Four tasks: `calc`, a bare product for any model (below); `chat_calc`, a sum of two products for
chat models after a worked example of a call in the plain format (`chat_splits`); `chat_calc_tools`, the
same questions with no worked example, the tool offered only through the chat template
(`chat_splits(demo=None)`), for a model whose template and training know tools (Qwen2.5);
`chat_calc_json`, the same questions after a worked example whose call is the bare JSON object such a
model writes (`chat_splits(demo=JSON_DEMO)`), the tool offered through the template too.

`calc`'s prompts look like ``347*28=``; the right answer is ``9716``. A small model rarely multiplies a
three-digit by a two-digit number in its head but can call the calculator and copy its result:
with a chat template it writes a Hermes `<tool_call>`, the built-in tiny model writes the plain
format (a turn ending in '=' is a call: envs/tools.py). The reward is exact match on the episode's
last assistant turn. The pairs (a, b), 100 ≤ a ≤ 999, 10 ≤ b ≤ 99, are drawn with a fixed seed
(1234, independent of the run's seed), distinct, the first EVAL_SIZE held out.
"""

from __future__ import annotations

import random

EVAL_SIZE = 200
TRAIN_SIZE = 2000
SPLIT_SEED = 1234
ENV = "calculator"


def splits(train_size: int = TRAIN_SIZE, eval_size: int = EVAL_SIZE) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, eval) rows {'prompt': 'a*b=', 'answer': str(a·b)}, disjoint, seed-independent."""
    rng = random.Random(SPLIT_SEED)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < train_size + eval_size:
        pairs[(rng.randint(100, 999), rng.randint(10, 99))] = None
    rows = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs]
    return rows[eval_size:], rows[:eval_size]


CHAT_TRAIN_SIZE = 2000
CHAT_EVAL_SIZE = 200
CHAT_FORMAT = "plain"
DEMO: list[dict[str, str]] = [
    {"role": "user", "content": "What is 12*34?"},
    {"role": "assistant", "content": "12*34="},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "408"},
]
"""The worked example every `chat_calc` conversation opens with: one call in the plain format
(envs/tools.py) and the answer copied from the tool.
It shows a single product while the questions ask for a sum of two (ae998e2:bench/probes/tool_openings.py, SmolLM2-135M-
Instruct, 16 held-out questions): with a worked example of the questions' own shape the model answers all
16 greedily before any training; with none it writes 1 well-formed call in 64 samples and answers none;
with this one it answers 6 of 16 greedily and 11 of 64 sampled at T 0.7 — room to
learn, and episodes that show how (docs/environments.md)."""


JSON_FORMAT = "json"
JSON_DEMO: list[dict[str, str]] = [DEMO[0], {"role": "assistant", "content": '{"name": "calculator", "arguments": '
                                                 '{"expression": "12*34"}}'}, *DEMO[2:]]
"""`DEMO` with its call as the bare JSON object Qwen2.5-Coder-0.5B-Instruct writes when the template offers
it a tool (29 of 32 first turns; `ae998e2:bench/probes/tool_answers.py`, bench/results/tool-answers-qwen0.5b.json).
With no worked example that model calls the calculator again after its result instead of answering (0 of
32 replies answer); after this one, 8 of 32 answer, all 8 right: episodes with something to reinforce."""


def chat_splits(train_size: int = CHAT_TRAIN_SIZE, eval_size: int = CHAT_EVAL_SIZE,
                demo: list[dict[str, str]] | None = DEMO) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows of the chat tool tasks: the conversation `demo` (`DEMO`; `JSON_DEMO` for
    `chat_calc_json`; None for `chat_calc_tools`) + "What is a*b + c*d?", 100 ≤ a, c ≤ 999 and 10 ≤ b, d ≤ 99 drawn with seed
    SPLIT_SEED + 1, distinct, the first `eval_size` held out; answer str(a·b + c·d) (one call solves it:
    'a*b+c*d'). Both tasks ask the same questions in the same order."""
    rng = random.Random(SPLIT_SEED + 1)
    quads: dict[tuple[int, int, int, int], None] = {}
    while len(quads) < train_size + eval_size:
        quads[(rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999), rng.randint(10, 99))] = None
    opening = list(demo or [])
    rows = [{"prompt": [*opening, {"role": "user", "content": f"What is {a}*{b} + {c}*{d}?"}],
             "answer": str(a * b + c * d)} for a, b, c, d in quads]
    return rows[eval_size:], rows[:eval_size]


TOOLS_SIZE = 4000
TOOL_SHARE = 0.2
"""The share of `tool_transcripts`' products that call the calculator; the rest answer in one turn."""


def _transcript(prompt: str, answer: str, call: bool) -> tuple[tuple[str, bool], ...]:
    """A call in the plain format and the answer copied from the tool, or the answer at once:
    ('a*b=', context) ('a*b=', model) (result, tool) (result, model), or ('a*b=', context) (result, model)."""
    if call:
        return ((prompt, False), (prompt, True), (answer, False), (answer, True))
    return ((prompt, False), (answer, True))


def tool_transcripts(size: int = TOOLS_SIZE, tool_share: float = TOOL_SHARE) -> list[tuple[tuple[str, bool], ...]]:
    """What the built-in `tiny-tools` model is warm-started on (models/tiny.py), in shuffled order:

    - `size` sums a+b, every one worked through the calculator: the model learns to call it and
      copy its answer (a copy its two layers learn only from thousands of examples);
    - `size` products a*b, a `tool_share` of them through the calculator and the rest answered at
      once, which no model of its size can compute.

    Both of `calc`'s shape (100 ≤ a ≤ 999, 10 ≤ b ≤ 99, seed SPLIT_SEED + 2; no product of `calc`'s
    train or held-out split). So the warm-started model can use the calculator but mostly guesses
    products: RL on `calc` has calls that earn the reward to reinforce (docs/environments.md)."""
    train, held_out = splits()
    taken = {r["prompt"] for r in train + held_out}
    rng = random.Random(SPLIT_SEED + 2)
    out: list[tuple[tuple[str, bool], ...]] = []
    sums: set[str] = set()
    while len(sums) < size:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if f"{a}+{b}=" not in sums:
            sums.add(f"{a}+{b}=")
            out.append(_transcript(f"{a}+{b}=", str(a + b), True))
    products = 0
    while products < size:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if f"{a}*{b}=" in taken:
            continue
        taken.add(f"{a}*{b}=")
        out.append(_transcript(f"{a}*{b}=", str(a * b), rng.random() < tool_share))
        products += 1
    rng.shuffle(out)
    return out
