"""The built-in tiny model: built deterministically, cached atomically, loadable by transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmrl.models.tiny import TINY_VERSION, build_tiny, default_cache_dir, ensure_tiny
from llmrl.tasks import tiny_corpus


def test_build_is_deterministic_and_loads_with_transformers(tmp_path: Path) -> None:
    a = build_tiny(tmp_path / "a", tiny_corpus(), steps=3, show_progress=False)
    b = build_tiny(tmp_path / "b", tiny_corpus(), steps=3, show_progress=False)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    c = build_tiny(tmp_path / "c", tiny_corpus(), steps=3, seed=1, show_progress=False)
    wc = load_file(c / "model.safetensors")
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)
    model = AutoModelForCausalLM.from_pretrained(a)
    tok = AutoTokenizer.from_pretrained(a)
    assert tok.padding_side == "left" and tok.eos_token_id == model.config.eos_token_id
    assert not list(tmp_path.glob(".*tmp*")), "no temporary folders may be left behind"


def test_ensure_tiny_builds_once_then_reuses(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / f"tiny-{TINY_VERSION}"
    import llmrl.models.tiny as tiny

    calls = []
    real = tiny.build_tiny
    monkeypatch.setattr(tiny, "build_tiny", lambda out, corpus, **kw: calls.append(out) or real(out, corpus, steps=2, show_progress=False))
    first = ensure_tiny(tiny_corpus, show_progress=False)
    second = ensure_tiny(tiny_corpus, show_progress=False)
    assert first == second == tmp_path / f"tiny-{TINY_VERSION}"
    assert len(calls) == 1


def test_a_pair_and_a_transcript_are_encoded_with_the_loss_on_the_models_turns_only() -> None:
    from llmrl.models.tiny import _encode_train
    from llmrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    call = (("12*3=", False), ("12*3=", True), ("36", False), ("36", True))
    ids, attn, loss = _encode_train(tok, [("1+2=", "3"), call])
    c = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    # the transcript: prompt (5) | call + EOS (6, trained) | tool's 36 (2) | 36 + EOS (3, trained): 16 tokens
    assert ids[1].tolist() == c("12*3=") + c("12*3=") + [eos] + c("36") + c("36") + [eos]
    assert loss[1].tolist() == [False] * 5 + [True] * 6 + [False] * 2 + [True] * 3
    # the pair, left-padded to 16: '1+2=' (4) | '3' + EOS (2, trained)
    assert ids[0].tolist() == [pad] * 10 + c("1+2=") + c("3") + [eos]
    assert loss[0].tolist() == [False] * 14 + [True] * 2 and attn[0].tolist() == [0] * 10 + [1] * 6
    # a pair is the transcript ((prompt, False), (answer, True)), bit for bit
    same = _encode_train(tok, [(("1+2=", False), ("3", True)), call])
    assert all(torch.equal(x, y) for x, y in zip(same, (ids, attn, loss)))


def test_tiny_tools_is_warm_started_on_calls_of_calcs_shape_none_of_calcs_own() -> None:
    from llmrl.tasks import TINY_TOOLS, calc
    from llmrl.models.load import BUILTIN_MODELS

    assert TINY_TOOLS in BUILTIN_MODELS
    corpus = calc.tool_transcripts()
    assert corpus == calc.tool_transcripts()  # seed-independent, the same every time
    sums = [t for t in corpus if "+" in t[0][0]]
    products = [t for t in corpus if "*" in t[0][0]]
    assert len(sums) == len(products) == calc.TOOLS_SIZE
    assert all(len(t) == 4 for t in sums)  # every sum through the calculator
    calls = [t for t in products if len(t) == 4]
    assert abs(len(calls) / len(products) - calc.TOOL_SHARE) < 0.02  # ≈ 20 % of products: 800 ± 80 of 4000
    a, b = map(int, calls[0][0][0][:-1].split("*"))
    assert calls[0] == ((f"{a}*{b}=", False), (f"{a}*{b}=", True), (str(a * b), False), (str(a * b), True))
    train, held_out = calc.splits()
    assert not {t[0][0] for t in products} & {r["prompt"] for r in train + held_out}


def test_tiny_guess_is_warm_started_on_scans_and_halvings_of_train_games_only() -> None:
    from llmrl.models.load import BUILTIN_MODELS
    from llmrl.tasks import TINY_GUESS, guess

    assert TINY_GUESS in BUILTIN_MODELS
    corpus = guess.sign_transcripts()
    assert corpus == guess.sign_transcripts() and len(corpus) == guess.SIGNS_GAMES
    train, held_out = guess.sign_splits()
    assert not {t[0][0] for t in corpus} - {r["prompt"] for r in train}  # every game's prompt is a train range
    secrets = {(r["prompt"], r["answer"]) for r in held_out}

    def play(t):  # the guesses, the answers, and whether the last guess won
        guesses = [int(x) for x, model in t[1:] if model]
        return guesses, [x for x, model in t[1:] if not model]

    halvings = scans = 0
    for t in corpus:
        low = int(t[0][0][1:].split()[0])
        guesses, answers = play(t)
        assert len(guesses) <= 4 and len(answers) == len(guesses) - 1 and set(answers) <= {"+", "-"}
        if guesses[0] == low and guesses == list(range(low, low + len(guesses))):
            scans += 1
        else:  # the halving: each guess the middle of what the answers allow ((20 29) opens with 24)
            lo, hi = low, low + 9
            for k, g in enumerate(guesses):
                assert g == (lo + hi) // 2
                if k < len(answers):
                    lo, hi = (g + 1, hi) if answers[k] == "+" else (lo, g - 1)
            assert lo <= guesses[-1] <= hi and (len(guesses) < 4 or lo == hi)  # the last guess is the only one left
            halvings += 1
    assert abs(halvings / len(corpus) - guess.HALVING_SHARE) < 0.03  # ≈ 3200 of 8000
    assert scans + halvings == len(corpus) and secrets  # a scan whose first guess wins counts as a scan


def test_the_guess_environment_answers_in_the_rows_own_words() -> None:
    from llmrl.envs import resolve_env
    from llmrl.tasks import guess

    row = guess.sign_splits()[1][0]  # (85 94), secret 86
    env = resolve_env("guess").make()
    assert env.reset(row, 0) == [{"role": "user", "content": "(85 94)"}]
    assert env.step("85", []).messages == [{"role": "user", "content": "+"}]
    assert env.step("94", []).messages == [{"role": "user", "content": "-"}]
    assert env.step("x", []).messages == [{"role": "user", "content": "(85 94)"}]  # no number: the rule again
    assert env.step("86", []).done
    plain = resolve_env("guess").make()
    plain.reset(guess.splits()[1][0], 0)
    assert plain.step("1", []).messages == [{"role": "user", "content": "Higher."}]
