"""Shared fixtures: a tiny random Llama model saved to disk, built in-process (no hub)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The suite runs in two pytest-xdist workers on CI's 2 cores (pyproject's addopts): one torch thread each,
# and the same for every process a test starts (they inherit it), so that 2 cores never run 4 threads that
# wait on each other. Set before torch is imported, which reads it once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.models.tokenizer import build_char_tokenizer


def make_tiny_model(seed: int = 0) -> LlamaForCausalLM:
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a random 2-layer Llama and the char tokenizer, loadable by `--model`."""
    path = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model().save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's cache: a built-in model built by a test lands in a temp folder."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def warm_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tiny model, warm-started for real (≈ 20 s once per session): rewards are non-zero. It is
    the folder `--model tiny` (the default) resolves to under this session's LLMRL_CACHE_DIR (`_isolated_cache`),
    so that whichever asks first builds it and the other reuses it: one build per session, not two."""
    from llmrl.models.tiny import TINY_VERSION, ensure_tiny

    from llmrl.tasks import tiny_corpus

    cache = tmp_path_factory.getbasetemp() / "cache" / f"tiny-{TINY_VERSION}"  # default_cache_dir() there
    return ensure_tiny(tiny_corpus, cache, show_progress=False)


import importlib.util  # noqa: E402

# tests/vllm/ needs vLLM, which pins transformers<5.20: tests/vllm/run builds its own virtualenv and
# runs them there (the README's test command calls it). Elsewhere they are not collected at all.
collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["vllm/*"]


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's hook
    """The controlling process (or the only one) names a folder where each xdist worker leaves its fuzz
    tally at its end; the workers inherit the variable."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["LLMRL_FUZZ_TALLY_DIR"] = tempfile.mkdtemp(prefix="llmrl-fuzz-tally-")


def pytest_sessionfinish(session) -> None:  # noqa: ANN001 - pytest's hook
    worker, folder = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("LLMRL_FUZZ_TALLY_DIR")
    if worker and folder:
        from tests.fuzzing import save_tally

        save_tally(Path(folder) / f"{worker}.json")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    """The fuzz tests' tally (tests/fuzzing.py): inputs tried per family, how many ran, were refused,
    summed over the xdist workers' tallies."""
    from tests.fuzzing import report_lines

    folder = os.environ.get("LLMRL_FUZZ_TALLY_DIR")
    lines = report_lines(sorted(Path(folder).glob("*.json")) if folder else [])
    if lines:
        terminalreporter.section("inputs fuzzed (issue 30)")
        for line in lines:
            terminalreporter.write_line(line)
