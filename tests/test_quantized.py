"""A 4-bit base (model.quantize=nf4) under actor, critic and reference, for real: bitsandbytes' nf4
layers on the CPU, under a random Qwen2-architecture model built in-process (tests/qwen2_tiny.py, no
download): loading, the three roles, generation, PPO and GRPO through the CLI, export, kill -9 and
resume, and the refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from llmrl.config import load_config
from llmrl.config.schema import LoraConfig, ModelConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings
from llmrl.engines.hf import hf_engine
from llmrl.errors import ConfigError
from llmrl.models.load import load_base
from llmrl.models.merged import mergeable
from llmrl.models.quantized import dequantize_weight, four_bit_layers, prepare, stored_size
from llmrl.models.sequences import layout
from llmrl.models.stack import PolicyStack
from llmrl.run.memory import role_costs
from tests.helpers import cli_run, is_timing, kill_9_after, resume_equals
from tests.qwen2_tiny import make_qwen2, save_qwen2

bnb = pytest.importorskip("bitsandbytes")  # the test extra installs it: CI runs every test here

REWARD = '''
def digit_share(prompts, completions, **_):
    """A dense reward a random model earns too: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_qwen2(tmp_path_factory.mktemp("qwen2-nf4"))


def _nf4(path: Path) -> ModelConfig:
    return ModelConfig(name=str(path), dtype="float32", quantize="nf4")


def _cli(path: Path, out: Path, tmp: Path, *extra: str) -> list[str]:
    (tmp / "digits.py").write_text(REWARD)
    return [sys.executable, "-m", "llmrl", "train", "--model", str(path), "--out", str(out), "--task", "arithmetic",
            "--reward", f"{tmp / 'digits.py'}:digit_share", "--set", "model.quantize=nf4", "--set", "threads=1",
            "--set", "rollout.max_new_tokens=6", "--set", "eval.size=8", "--set", "eval.every=0",
            "--set", "lora.r=4", "--set", "lora.alpha=8", "--set", "update.lr_actor=1e-2", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


def test_every_decoder_linear_layer_is_4_bit_and_the_head_stays_float(qwen_dir: Path) -> None:
    base, _ = load_base(_nf4(qwen_dir))
    layers = four_bit_layers(base)
    assert len(layers) == 2 * len(PROJECTIONS)  # 2 decoder layers × 7 projections
    assert all(type(layer) is bnb.nn.Linear4bit and layer.weight.dtype == torch.uint8 for layer in layers)
    assert type(base.lm_head) is nn.Linear and base.lm_head.weight.dtype == torch.float32
    plain = make_qwen2()
    for name, layer in base.named_modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            out_f, in_f = plain.get_submodule(name).weight.shape
            numbers, size = stored_size(layer.weight)
            assert numbers == out_f * in_f
            # codes: two numbers a byte; scales: one uint8 absmax per block of 64 (double quant), plus the
            # second-level float32 scales and the two code tables (16 + 256 floats), under 2 KiB a layer
            assert out_f * in_f // 2 + out_f * in_f // 64 <= size < out_f * in_f // 2 + out_f * in_f // 64 + 2048


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_4_bit_layer_computes_dequantize_and_multiply_in_the_model_dtype(qwen_dir: Path, dtype: str) -> None:
    """What bitsandbytes does with the setting `prepare` makes, not the setting: a no-grad call in eval
    mode (where, on a CPU with avx512_bf16, bitsandbytes would pack the layer for its fused bfloat16
    kernel) leaves the codes unpacked and returns exactly F.linear(x, deq(W_q), b) in `model.dtype`,
    the same function a gradient call computes, whose gradient reaches x."""
    base, _ = load_base(ModelConfig(name=str(qwen_dir), dtype=dtype, quantize="nf4"))
    torch.manual_seed(0)
    for layer in four_bit_layers(base):
        x = torch.randn(5, layer.in_features, dtype=getattr(torch, dtype))
        assert layer.compute_dtype == x.dtype and not layer.training
        with torch.no_grad():
            y = layer(x)
        assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)  # no packed layout made
        assert y.dtype == x.dtype and torch.equal(y, F.linear(x, dequantize_weight(layer), layer.bias))
        x.requires_grad_(True)
        layer(x).sum().backward()  # dy/dx of Σ (x·deqᵀ + b) = 1·deq
        torch.testing.assert_close(x.grad, torch.ones_like(y) @ dequantize_weight(layer))


def test_memory_table_counts_the_base_in_4_bits(qwen_dir: Path) -> None:
    base, _ = load_base(_nf4(qwen_dir))
    stack = PolicyStack(base, LoraConfig(r=4), with_critic=True)
    plain = make_qwen2()
    row = role_costs(stack)[0]
    assert row.params == sum(p.numel() for p in plain.parameters())  # every number of the model, 4-bit or not
    linear = sum(p.numel() for n, p in plain.named_parameters() if n.endswith("proj.weight"))
    other = sum(p.numel() for n, p in plain.named_parameters() if not n.endswith("proj.weight"))
    # float32 embeddings, head, norms and biases: 4 bytes a number; the 4-bit weights 0.5 + 1/64 and ≤ 2 KiB a layer
    assert 4 * other + linear * (0.5 + 1 / 64) <= row.bytes < 4 * other + linear * (0.5 + 1 / 64) + 14 * 2048


@pytest.mark.parametrize("kind", ["nf4", "fp4"])
def test_zero_lora_actor_equals_the_reference_exactly_and_a_trained_one_does_not(qwen_dir: Path, kind: str) -> None:
    """peft starts every LoRA B at 0, so the actor computes deq(W_q)·x + s·B·(A·x) = deq(W_q)·x + 0: the
    reference's numbers bit for bit; with B ≠ 0 they must differ (the test can fail)."""
    base, _ = load_base(ModelConfig(name=str(qwen_dir), dtype="float32", quantize=kind))
    assert four_bit_layers(base) and all(layer.weight.quant_state.quant_type == kind for layer in four_bit_layers(base))
    stack = PolicyStack(base, LoraConfig(r=4), with_critic=True)
    torch.manual_seed(0)
    prompts, responses = torch.randint(21, 4096, (4, 7)), torch.randint(21, 4096, (4, 5))
    seq = layout(prompts, torch.ones_like(prompts), responses, torch.ones_like(responses))
    mask = torch.ones_like(responses, dtype=torch.bool)

    def logp(role: str) -> torch.Tensor:
        with torch.no_grad(), stack.use(role):
            return stack.response_stats(seq, responses, mask, 1.0)[0]

    assert torch.equal(logp("actor"), logp("reference"))
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if "lora_B.actor" in name:
                p.normal_(std=0.1)
    assert (logp("actor") - logp("reference")).abs().max() > 1e-3


@pytest.mark.parametrize("copies", [True, False], ids=["dequantized-copies", "4-bit-layers"])
def test_generation_log_mu_is_the_training_log_pi_old(qwen_dir: Path, copies: bool) -> None:
    """The hf engine decodes the actor on the CPU through a transient float copy W′ = deq(W_q) + s·B·A
    (`copies`, engine.merge_lora's default), or through the adapters on the 4-bit layers (both copies
    off); either way its decoding log-probs are those a full forward computes. Both multiply the same
    deq(W_q) in float32 and differ only by the order of float32 sums (a KV-cached step against one
    forward, W′x against W·x + s·B·(A·x)): ~1e-6 per logit at these sizes, far inside 1e-4."""
    base, tok = load_base(_nf4(qwen_dir))
    stack = PolicyStack(base, LoraConfig(r=4), with_critic=False)
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if "lora_B.actor" in name:
                p.normal_(std=0.1)
    engine = hf_engine(stack=stack, tokenizer=tok)
    engine.merge = engine.pack = copies
    assert mergeable(stack)
    linear = sum(stored_size(layer.weight)[0] for layer in four_bit_layers(base))
    # the copy: every adapted (here: every) 4-bit layer's numbers in float32, only while generating
    assert engine.memory() == ([("hf engine: de-quantised merged actor W + s·B·A (while generating)", linear, 4 * linear)]
                               if copies else [])
    torch.manual_seed(1)
    prompts = torch.randint(21, 4096, (3, 6))
    settings = SamplingSettings(max_new_tokens=8, temperature=1.0, top_p=1.0)
    request = GenerationRequest(prompts, torch.ones_like(prompts, dtype=torch.bool), 2, settings, role="actor",
                                keys=torch.arange(6), logprobs=True)
    gen = engine.generate(request)
    seq = layout(prompts.repeat_interleave(2, 0), torch.ones(6, 6, dtype=torch.long), gen.response_ids,
                 gen.response_mask.long())
    with torch.no_grad(), stack.use("actor"):
        old = stack.response_stats(seq, gen.response_ids, gen.response_mask, 1.0)[0]
    mask = gen.response_mask
    torch.testing.assert_close(gen.logprobs[mask], old[mask], atol=1e-4, rtol=0)
    assert all(type(layer).forward is bnb.nn.Linear4bit.forward and "forward" not in layer.__dict__
               for layer in four_bit_layers(base))  # every 4-bit layer back to its own kernel after


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_ppo_and_grpo_train_on_a_4_bit_base(qwen_dir: Path, tmp_path: Path, algo: str) -> None:
    out = tmp_path / "run"
    shape = (["--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=8"] if algo == "ppo" else
             ["--set", "rollout.prompts_per_step=2", "--set", "rollout.num_generations=4",
              "--set", "update.minibatch_size=8"])
    done = subprocess.run(_cli(qwen_dir, out, tmp_path, "--algo", algo, "--steps", "3", *shape), env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "linear layers in nf4" in said and "The nf4 base holds" in said
    rows = _metrics(out)
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["policy_loss"])) for r in rows)
    saved = load_file(out / "adapters" / "actor" / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in saved.items())  # the actor moved
    if algo == "ppo":
        head = load_file(out / "value_head.safetensors")  # zero at the start (V ≡ 0): the critic trained
        assert any(v.abs().max() > 0 for v in head.values())
    config = (out / "config.yaml").read_text()
    assert "quantize: nf4" in config


def test_export_merges_into_the_dequantised_base_and_loads_in_plain_transformers(qwen_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """The export holds W' = deq(W_q) + s·B·A in float32 where the run computed deq(W_q)·x + s·B·(A·x):
    the same numbers summed in another order, ~1e-6 relative per product over 2 layers: 1e-4 holds."""
    from transformers import AutoModelForCausalLM

    from llmrl.run.actor import load_actor

    run, out = tmp_path / "run", tmp_path / "export"
    subprocess.run(_cli(qwen_dir, run, tmp_path, "--algo", "grpo", "--steps", "2", "--set", "rollout.prompts_per_step=2",
                        "--set", "rollout.num_generations=4", "--set", "update.minibatch_size=8"),
                   env=_env(), check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "llmrl", "export", str(run), "--out", str(out)], env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "merged into its de-quantised" in " ".join(done.stdout.split())
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in plain.modules())
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    stack, _, _ = load_actor(run)
    ids = torch.randint(21, 4096, (3, 10))
    with torch.no_grad(), stack.use("actor"):
        trained = stack.lm(ids).logits
        reference = None
    with torch.no_grad(), stack.use("reference"):
        reference = stack.lm(ids).logits
    with torch.no_grad():
        exported = plain(ids).logits
    torch.testing.assert_close(exported, trained, atol=1e-4, rtol=0)
    assert (trained - reference).abs().max() > 1e-3  # the adapter trained: the comparison can fail


def test_export_of_a_bfloat16_run_merges_into_the_runs_own_4_bit_copy(qwen_dir: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """model.dtype=bfloat16: the run quantised bfloat16 weights and multiplied by deq(W_q) in bfloat16. The
    export merges into that very matrix, from the copy the run wrote (the cache holds no second copy):
    W' = deq(W_q) + s·B·A in float32, up to float32's rounding of the sum (not bfloat16's, ~1e-3, which a
    float32 quantisation of the float checkpoint would differ by). With the copy gone it quantises the
    float checkpoint again and says so in one line. `--adapter-only` loads the run's copy too."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(cache))  # the subprocesses inherit it
    run, out = tmp_path / "run", tmp_path / "export"
    train = _cli(qwen_dir, run, tmp_path, "--algo", "grpo", "--steps", "2", "--set", "rollout.prompts_per_step=2",
                 "--set", "rollout.num_generations=4", "--set", "update.minibatch_size=8", "--set", "model.dtype=bfloat16")
    code, _, err = cli_run(train[3:])  # in-process: `llmrl train …`
    assert code == 0, err
    copies = sorted(p.name for p in (cache / "quantized").iterdir())
    code, _, err = cli_run(["export", str(run), "--out", str(out)])
    assert code == 0 and "llmrl:" not in err, err
    code, _, err = cli_run(["export", str(run), "--out", str(tmp_path / "adapter"), "--adapter-only"])
    assert code == 0 and "llmrl:" not in err, err
    assert sorted(p.name for p in (cache / "quantized").iterdir()) == copies  # no copy quantised afresh
    base, _ = load_base(ModelConfig(name=str(qwen_dir), dtype="bfloat16", quantize="nf4"))
    adapter = load_file(run / "adapters" / "actor" / "adapter_model.safetensors")
    exported = load_file(out / "model.safetensors")
    for name, layer in base.named_modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            a, b = (adapter[f"base_model.model.{name}.lora_{x}.weight"].float() for x in "AB")
            merged = dequantize_weight(layer).float() + (8 / 4) * (b @ a)  # lora.alpha / lora.r
            torch.testing.assert_close(exported[f"{name}.weight"], merged, atol=1e-6, rtol=0)
    shutil.rmtree(cache / "quantized")
    code, _, err = cli_run(["export", str(run), "--out", str(tmp_path / "again")])
    said = [line for line in err.splitlines() if line.startswith("llmrl:")]
    assert code == 0 and len(said) == 1 and "no cached nf4 copy" in said[0], err


def test_kill_9_then_resume_is_bit_identical_on_a_4_bit_base(qwen_dir: Path, tmp_path: Path) -> None:
    """PPO (actor, critic with its value head, reference) on the nf4 base: killed after step 4 of 8 and
    resumed, the metrics (but timings) and both adapters equal an uninterrupted run's."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    extra = ["--algo", "ppo", "--steps", "8", "--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=4",
             "--set", "checkpoint.every=2", "--set", "update.lr_schedule=cosine", "--set", "update.warmup_steps=2"]
    subprocess.run(_cli(qwen_dir, full, tmp_path, *extra), check=True, env=_env(), capture_output=True)
    kill_9_after(_cli(qwen_dir, killed, tmp_path, *extra), _env(), killed)
    resume_equals(full, killed, _env())


@pytest.mark.parametrize("sets, says", [
    (["--set", "model.quantize=nf4"], "the built-in 'tiny' model"),
    (["--model", "{qwen}", "--set", "model.quantize=nf4", "--set", "rollout.engine=vllm"], "rollout.engine=hf only"),
    (["--model", "{qwen}", "--set", "model.quantize=fp4", "--set", "dist.shard_base=true"], "dist.shard_base"),
    (["--model", "{qwen}", "--set", "model.quantize=int3"], "one of none, nf4, fp4"),
])
def test_refusals_are_one_sentence(qwen_dir: Path, tmp_path: Path, sets: list[str], says: str) -> None:
    args = [a.replace("{qwen}", str(qwen_dir)) for a in sets]
    code, _, err = cli_run(["train", "--out", str(tmp_path / "r"), *args])
    assert code == 2 and says in " ".join(err.split()), err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_a_model_with_nothing_quantized_is_refused() -> None:
    """`prepare` checks what transformers loaded: a model whose linear layers all stayed plain (here a
    float model, as a model of other layer kinds would come back) is refused in one sentence."""
    with pytest.raises(ConfigError, match="no linear layer bitsandbytes could quantize"):
        prepare("plain", make_qwen2(), "nf4")


HIDE_BNB = '''
import sys
class Hidden:
    """A finder that sees no bitsandbytes: what an installation without the package finds."""
    def __init__(self, finder):
        self.finder = finder
    def __getattr__(self, name):  # find_distributions and the rest: the wrapped finder's
        return getattr(self.finder, name)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "bitsandbytes":
            return None
        return self.finder.find_spec(name, path, target) if hasattr(self.finder, "find_spec") else None
sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from llmrl.cli import main
sys.argv = ["llmrl", *sys.argv[1:]]
main()
'''


def test_a_missing_bitsandbytes_is_named_with_its_install_command(qwen_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "hide.py").write_text(HIDE_BNB)
    done = subprocess.run([sys.executable, str(tmp_path / "hide.py"), "train", "--model", str(qwen_dir), "--out",
                           str(tmp_path / "r"), "--set", "model.quantize=nf4"], env=_env(), capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stderr
    assert "pip install 'llmrl[quant]'" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr


def test_llmrl_config_shows_the_setting(qwen_dir: Path) -> None:
    config = load_config(sets=[f"model.name={qwen_dir}", "model.quantize=nf4"])
    assert config.model.quantize == "nf4"
    with pytest.raises(ConfigError, match="built-in"):
        load_config(sets=["model.quantize=fp4"])
