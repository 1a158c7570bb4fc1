"""model.dtype / engine.dtype 'auto' (llmrl/config/precision.py): the fastest dtype from what the
hardware reports, written into the Config so that config.yaml and a resume name it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from llmrl.config import load_config
from llmrl.config import dtype_probe, precision
from llmrl.models.gguf import cache_root
from llmrl.errors import ConfigError
from llmrl.models.load import torch_dtype

AMX_CPU = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse avx2\n"


def test_fastest_dtype_follows_the_hardware() -> None:
    assert precision.cpu_flags(EPYC) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert precision.cpu_flags("") == set()
    assert precision.fastest_dtype("cpu", precision.cpu_flags(AMX_CPU)) == ("bfloat16", "the CPU has AMX (amx_bf16)")
    assert precision.fastest_dtype("cpu", precision.cpu_flags(EPYC)) == (  # no model named: no probe
        "float32", "the CPU has avx512_bf16 but no AMX, where bfloat16 is faster for some models, slower for others, "
        "and this model's shapes are not known before it is loaded")
    assert precision.fastest_dtype("cpu", precision.cpu_flags(OLD)) == (
        "float32", "the CPU has no bfloat16 instructions (no AMX, no avx512_bf16)")
    assert precision.fastest_dtype("cuda", cuda_bf16=True)[0] == "bfloat16"
    assert precision.fastest_dtype("cuda", cuda_bf16=False)[0] == "float32"


def test_dtype_note_says_when_a_hand_set_dtype_is_slower() -> None:
    amx = precision.cpu_flags(AMX_CPU)
    assert precision.dtype_note("bfloat16", "cpu", amx) == "the CPU has AMX (amx_bf16)"
    assert precision.dtype_note("float32", "cpu", amx) == "bfloat16 is faster here: the CPU has AMX (amx_bf16)"


def _probed(shapes: tuple[int, int, int], threads: int, flags: set[str], speedup: float) -> Path:
    """A cached probe result (what `dtype_probe.bf16_speedup` wrote on an earlier start) in the tests' cache."""
    key = dtype_probe._key(shapes, threads, flags)
    dtype_probe._MEMO.pop(key, None)  # as a new process would: it reads the file
    path = cache_root() / "dtype-probe" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"float32_s": speedup, "bfloat16_s": 1.0, "speedup": speedup}))
    return path


def _model_folder(tmp_path: Path) -> str:
    """A model folder whose config.json names a size the probe times (hidden ≥ MIN_HIDDEN)."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 512, "intermediate_size": 1024, "vocab_size": 900}))
    return str(tmp_path)


def test_on_avx512_bf16_alone_the_cached_probe_of_the_models_products_decides(tmp_path: Path) -> None:
    epyc, model = precision.cpu_flags(EPYC), _model_folder(tmp_path)
    shapes = dtype_probe.model_shapes(model)
    assert shapes == (512, 1024, 900)
    _probed(shapes, 2, epyc, 1.5)
    dtype, why = precision.fastest_dtype("cpu", epyc, model=model, threads=2)
    assert dtype == "bfloat16" and "1.50× faster in bfloat16" in why and "2 threads" in why
    _probed(shapes, 2, epyc, 1.49)  # under the 1.5× margin: float32
    assert precision.fastest_dtype("cpu", epyc, model=model, threads=2) == (
        "float32", "this model's products ran 1.49× in bfloat16, under 1.5×, on this CPU (avx512_bf16, no AMX; "
        "a cached microbenchmark, 2 threads)")
    _probed(shapes, 1, epyc, 1.7)  # threads are part of the key: 1 thread has its own measurement
    assert dtype_probe._key(shapes, 1, epyc) != dtype_probe._key(shapes, 2, epyc)
    assert precision.fastest_dtype("cpu", epyc, model=model, threads=1)[0] == "bfloat16"
    # AMX and a CPU without bfloat16 are decided by their flags alone, whatever a probe would say
    assert precision.fastest_dtype("cpu", precision.cpu_flags(OLD), model=model, threads=2)[0] == "float32"
    amx = precision.cpu_flags(AMX_CPU)
    assert precision.fastest_dtype("cpu", amx, model=model, threads=2) == ("bfloat16", "the CPU has AMX (amx_bf16)")
    # ... but with AMX too a model under MIN_HIDDEN stays float32 (the tiny default run: 0.373 s a step in
    # float32, 0.553 in bfloat16 on a Xeon with AMX, docs/performance.md)
    dtype, why = precision.fastest_dtype("cpu", amx, model="tiny", threads=2)
    assert dtype == "float32" and why.startswith("a model this small (hidden size 64) gains nothing from bfloat16, even with AMX")
    # a model as small as the built-in tiny one is never probed: float32, whatever a cached probe says
    _probed(dtype_probe.model_shapes("tiny"), 2, epyc, 9.0)
    dtype, why = precision.fastest_dtype("cpu", epyc, model="tiny", threads=2)
    assert dtype == "float32" and why.startswith("a model this small (hidden size 64)")


def test_without_a_writable_cache_a_run_of_several_processes_gets_no_probe(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(blocked))
    monkeypatch.setattr(dtype_probe, "_MEMO", {})
    monkeypatch.setenv("WORLD_SIZE", "2")  # its ranks could measure differently: no decision
    assert dtype_probe.bf16_speedup((48, 96, 40), 1, {"avx512_bf16"}) is None
    dtype, why = precision.fastest_dtype("cpu", {"avx512_bf16"}, model=_model_folder(tmp_path), threads=3)
    assert dtype == "float32" and "no writable cache" in why
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: measured for itself, kept for the process
    speedup = dtype_probe.bf16_speedup((48, 96, 40), 1, {"avx512_bf16"})
    assert speedup is not None and speedup > 0 and dtype_probe.bf16_speedup((48, 96, 40), 1, {"avx512_bf16"}) == speedup


def test_the_probe_measures_once_then_reads_its_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shapes, flags = (32, 64, 40), {"avx512_bf16"}
    monkeypatch.setattr(dtype_probe, "_MEMO", {})
    speedup = dtype_probe.bf16_speedup(shapes, 1, flags, root=tmp_path)
    (path,) = (tmp_path / "dtype-probe").glob("*.json")  # beside its .lock
    saved = json.loads(path.read_text())
    assert saved["float32_s"] > 0 and saved["bfloat16_s"] > 0 and saved["shapes"] == [32, 64, 40]
    assert saved["version"] == dtype_probe.VERSION and path.stem == dtype_probe._key(shapes, 1, flags)
    assert speedup == saved["speedup"] == saved["float32_s"] / saved["bfloat16_s"]
    monkeypatch.setattr(dtype_probe, "_MEMO", {})  # a later process: the file, not a new measurement

    def never(*_: object) -> dict:
        raise AssertionError("measured again")

    monkeypatch.setattr(dtype_probe, "measure", never)
    assert dtype_probe.bf16_speedup(shapes, 1, flags, root=tmp_path) == speedup


def test_the_probe_times_at_most_cap_columns() -> None:
    assert dtype_probe._capped((4096, 11008, 151936)) == (4096, 11008, dtype_probe.CAP)  # a 7 B model's head
    assert dtype_probe._capped((576, 1536, 49152)) == (576, 1536, 16384)


def test_model_shapes_come_from_the_models_own_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tests.test_gguf_cache import write_tiny_gguf

    from llmrl.models.gguf import plain_copy
    from llmrl.models.tiny import RECIPE
    from llmrl.models.tokenizer import build_char_tokenizer

    vocab = len(build_char_tokenizer())
    assert dtype_probe.model_shapes("tiny") == dtype_probe.model_shapes("tiny-tools") == (
        RECIPE.hidden_size, RECIPE.intermediate_size, vocab)
    assert dtype_probe.model_shapes(str(tiny_model_dir)) == (32, 64, vocab)  # conftest's make_tiny_model
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    from_metadata = dtype_probe.model_shapes(str(gguf))  # never loaded: read from the file's metadata
    plain_copy(gguf)
    from_copy = dtype_probe.model_shapes(str(gguf))  # its cached copy's config.json
    assert from_metadata == from_copy and from_copy is not None and from_copy[0] == 32
    assert dtype_probe.model_shapes("nobody/not-a-model-here") is None
    assert dtype_probe.model_shapes(str(tmp_path / "missing-folder")) is None
    assert dtype_probe.model_shapes("~nobody-here-at-all/model") is None  # expanduser raises RuntimeError


def test_auto_is_resolved_into_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    read = precision.cpu_flags
    # the default model is tiny: below MIN_HIDDEN, float32 with AMX too and on the EPYC with no probe at all;
    # a model of hidden size 512 is bfloat16 with AMX
    for text, want in ((AMX_CPU, "float32"), (EPYC, "float32")):
        monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None, text=text: read(text))  # this CPU's flags
        cfg = load_config()  # the schema's default, model.dtype auto
        assert cfg.model.dtype == want
        cfg = load_config(sets=["engine.dtype=auto", "model.dtype=float16"])
        assert (cfg.model.dtype, cfg.engine.dtype) == ("float16", want)  # a hand-set dtype is kept
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: read(AMX_CPU))
    assert load_config(overrides={"model.name": _model_folder(tmp_path)}).model.dtype == "bfloat16"
    with pytest.raises(ConfigError):
        load_config(sets=["model.dtype=fp8"])


def test_a_config_built_without_load_config_resolves_auto_for_its_model(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    # load_base(ModelConfig(...)) leaves model.dtype 'auto' to models/load.torch_dtype: with AMX it picks what
    # load_config would for the model named, float32 for the tiny one
    read = precision.cpu_flags
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: read(AMX_CPU))
    assert torch_dtype("auto", "cpu", "tiny") == torch.float32
    assert torch_dtype("auto", "cpu", _model_folder(tmp_path)) == torch.bfloat16
    assert torch_dtype("auto", "cpu") == torch.bfloat16  # no model named: the hardware's rule alone
    assert torch_dtype("float32", "cpu", _model_folder(tmp_path)) == torch.float32  # a dtype set is kept


def test_a_python_api_run_writes_the_dtype_it_trained_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """train(Config(...)) never passes load_config: its 'auto' is resolved at the start of the run (precision.resolved),
    so config.yaml names the dtype the run trained in and an evaluation or a resume loads that one."""
    import yaml
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmrl import Config, train
    from llmrl.config.schema import EvalConfig, ModelConfig, RolloutConfig, UpdateConfig
    from llmrl.models.tokenizer import build_char_tokenizer

    read = precision.cpu_flags
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: read(AMX_CPU))  # AMX: bfloat16 at hidden ≥ 256
    tok, folder = build_char_tokenizer(), tmp_path / "model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=dtype_probe.MIN_HIDDEN, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                 max_position_embeddings=64, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                 eos_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    config = Config(steps=1, out=str(tmp_path / "run"), threads=1, model=ModelConfig(name=str(folder)),
                    eval=EvalConfig(size=2, every=0), rollout=RolloutConfig(prompts_per_step=2, max_new_tokens=4),
                    update=UpdateConfig(minibatch_size=2))
    assert (config.model.dtype, config.engine.dtype) == ("auto", None)
    train(config)
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (written["model"]["dtype"], written["engine"]["dtype"]) == ("bfloat16", None)
    # a hand-set dtype is kept, engine.dtype 'auto' is resolved as model.dtype's is
    kept = precision.resolved(Config(model=ModelConfig(name=str(folder), dtype="float16"),
                                     engine=replace(Config().engine, dtype="auto")))
    assert (kept.model.dtype, kept.engine.dtype) == ("float16", "bfloat16")
