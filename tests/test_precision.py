"""model.dtype / engine.dtype 'auto' (llmrl/config/precision.py): the fastest dtype from what the
hardware reports, written into the Config so that config.yaml and a resume name it."""

from __future__ import annotations

import pytest

from llmrl.config import load_config
from llmrl.config import precision
from llmrl.errors import ConfigError

AMX_CPU = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse avx2\n"


def test_fastest_dtype_follows_the_hardware() -> None:
    assert precision.cpu_flags(EPYC) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert precision.cpu_flags("") == set()
    assert precision.fastest_dtype("cpu", precision.cpu_flags(AMX_CPU)) == ("bfloat16", "the CPU has AMX (amx_bf16)")
    assert precision.fastest_dtype("cpu", precision.cpu_flags(EPYC)) == (
        "float32", "the CPU has avx512_bf16 but no AMX, where bfloat16 is faster for some models, slower for others")
    assert precision.fastest_dtype("cpu", precision.cpu_flags(OLD)) == (
        "float32", "the CPU has no bfloat16 instructions (no AMX, no avx512_bf16)")
    assert precision.fastest_dtype("cuda", cuda_bf16=True)[0] == "bfloat16"
    assert precision.fastest_dtype("cuda", cuda_bf16=False)[0] == "float32"


def test_dtype_note_says_when_a_hand_set_dtype_is_slower() -> None:
    amx = precision.cpu_flags(AMX_CPU)
    assert precision.dtype_note("bfloat16", "cpu", amx) == "the CPU has AMX (amx_bf16)"
    assert precision.dtype_note("float32", "cpu", amx) == "bfloat16 is faster here: the CPU has AMX (amx_bf16)"


def test_auto_is_resolved_into_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    read = precision.cpu_flags
    for text, want in ((AMX_CPU, "bfloat16"), (EPYC, "float32")):
        monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None, text=text: read(text))  # this CPU's flags
        cfg = load_config()  # the schema's default, model.dtype auto
        assert cfg.model.dtype == want
        cfg = load_config(sets=["engine.dtype=auto", "model.dtype=float16"])
        assert (cfg.model.dtype, cfg.engine.dtype) == ("float16", want)  # a hand-set dtype is kept
    with pytest.raises(ConfigError):
        load_config(sets=["model.dtype=fp8"])
