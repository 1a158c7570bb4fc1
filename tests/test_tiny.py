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
