"""Data-parallel runs over torch.distributed: who this process is, and the few collectives the engine needs.

A run started by torchrun (environment RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) with
WORLD_SIZE > 1 joins a process group (gloo on CPU, nccl with device cuda:LOCAL_RANK on CUDA).
Everything else sees world size 1: no process group, and every helper below is the identity, so a
single-process run computes exactly the numbers it computed before this module existed.

How the W processes share one step of B prompts (N = B·G rows):

    rank r owns prompts [r·B/W, (r+1)·B/W) of the step (all G samples of a prompt stay together),
    i.e. rows [r·N/W, (r+1)·N/W) of the global batch.

Global quantities are sums over ranks (`sum`): advantage whitening (Σx, Σm, Σ(x−μ)²), the token
count that normalises a minibatch's loss, the logged means. Gradients: each rank's loss is its
*share* of the global minibatch loss (normalised by the global token/row count), so the gradient of
the global loss is the SUM of the ranks' gradients. `sum_gradients` does exactly that with one
`all_reduce` over the flattened gradients of the role's trainable parameters, once per optimizer
step (like DDP's bucketed all-reduce after `no_sync` micro-batches).

Why not DistributedDataParallel: DDP hooks the parameters that require grad when it is built, and
expects every rank to run the same sequence of forward/backward calls. Here (1) peft's `set_adapter`
flips `requires_grad` between the actor and the critic pass on one shared module, and (2) a
minibatch is cut from a global permutation of the N rows (that is what makes the update identical
for every world size), so ranks hold unequal shares of it, possibly none, and run different numbers
of micro-batches. One explicit `all_reduce` of exactly the trainable gradients is the same
communication without those two assumptions.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import ConfigError, LLMRLError, RunFailed
from ..ops import masked_sum, whiten as local_whiten

T = TypeVar("T")


class PeerLost(RunFailed):
    """A collective failed: another process of the run died, hung past the timeout or lost its link."""


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run. The default is the single-process run (no process group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collective tensors live
    lockstep: bool = False  # the base is sharded (fsdp.py): every rank must run the same number of forwards

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- sharding ------------------------------------------------------------------------------
    def shard(self, n: int) -> slice:
        """This rank's contiguous part [r·n/W, (r+1)·n/W) of n items (n divisible by W)."""
        if n % self.world_size:
            raise ConfigError(f"{n} items cannot be split evenly over {self.world_size} processes.")
        k = n // self.world_size
        return slice(self.rank * k, (self.rank + 1) * k)

    def local_rows(self, rows: Tensor, n_local: int) -> Tensor:
        """The global row indices in `rows` that this rank holds, as local indices (order kept)."""
        if not self.active:
            return rows
        lo = self.rank * n_local
        return rows[(rows >= lo) & (rows < lo + n_local)] - lo

    # ---- collectives (identity when not active) ------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (RuntimeError, ConnectionError) as exc:  # DistBackendError, gloo/nccl socket errors, timeouts
            raise PeerLost(
                f"Rank {self.rank} of {self.world_size} lost the other processes during {what}: one of them stopped, "
                f"hung longer than dist.timeout_s or lost its connection ({_first_words(exc)})."
            ) from None

    def sum(self, x: Tensor) -> Tensor:
        """Σ over ranks of `x` (a new tensor, same dtype and device as `x`)."""
        if not self.active:
            return x
        buf = x.detach().to(self.device, copy=True)
        self._call("a sum", lambda: dist.all_reduce(buf))
        return buf.to(x.device)

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Σ over ranks of each value (one float64 all-reduce)."""
        if not self.active:
            return list(values)
        return self.sum(torch.tensor(list(values), dtype=torch.float64)).tolist()

    def max_floats(self, values: Sequence[float]) -> list[float]:
        """The maximum over ranks of each value (one float64 all-reduce)."""
        if not self.active:
            return list(values)
        buf = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        self._call("a maximum", lambda: dist.all_reduce(buf, op=dist.ReduceOp.MAX))
        return buf.tolist()

    def any(self, flag: bool) -> bool:
        """True when `flag` is True on at least one rank."""
        return bool(flag) if not self.active else self.sum_floats([float(bool(flag))])[0] > 0

    def all_done(self, finished: bool) -> bool:
        """Whether decoding may stop: `finished` here, or, with a sharded base (`lockstep`: every
        forward is a collective), only when every rank is finished."""
        return finished if not self.lockstep else not self.any(not finished)

    def gather_rows(self, x: Tensor) -> Tensor:
        """Concatenate every rank's equally shaped `x` along dim 0, in rank order."""
        if not self.active:
            return x
        parts = [torch.empty_like(x, device=self.device) for _ in range(self.world_size)]
        self._call("a gather", lambda: dist.all_gather(parts, x.contiguous().to(self.device)))
        return torch.cat(parts).to(x.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        self._call("a gather", lambda: dist.all_gather_object(out, obj))
        return out

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        self._call("a broadcast", lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Copy rank 0's values into `params` on every rank (as DDP does when it is built), so the
        ranks start from identical adapters even if their initialisation differed."""
        if not self.active:
            return
        with torch.no_grad():
            for p in params:
                buf = p.detach().to(self.device, copy=True)
                self._call("a broadcast", lambda: dist.broadcast(buf, src=0))
                p.copy_(buf)

    def barrier(self) -> None:
        if self.active:
            self._call("a barrier", lambda: dist.barrier())

    # ---- agreeing on errors --------------------------------------------------------------------
    def agree(self, fn: Callable[[], T]) -> T:
        """Run `fn` on every rank; if it raised an LLMRLError on any rank, raise it on every rank.

        Without this, a rank whose reward function fails would leave the others waiting in the
        next collective until the timeout."""
        if not self.active:
            return fn()
        result, error = None, None
        try:
            result = fn()
        except LLMRLError as exc:
            error = exc
        errors = self.gather_objects(None if error is None else (type(error), str(error), error.exit_code))
        first = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
        if first is not None:
            rank, (kind, message, code) = first
            if error is not None and rank == self.rank:
                raise error
            exc = kind.__new__(kind)
            LLMRLError.__init__(exc, f"{message} (on rank {rank})", code)
            raise exc
        return result  # type: ignore[return-value]

    def main_only(self, fn: Callable[[], T]) -> T | None:
        """Run `fn` on rank 0 only (the others get None) and wait for it; an LLMRLError raised
        there is raised on every rank. For writing the run folder."""
        return self._first(fn, local=False, then_others=False)

    def main_first(self, fn: Callable[[], T], local: bool = False) -> T:
        """Run `fn` on rank 0 (on each node's local rank 0 with `local`), then on the others; an
        LLMRLError raised first is raised on every rank. For work whose first run fills a cache
        (building the built-in model) that the others then read."""
        return self._first(fn, local, then_others=True)  # type: ignore[return-value]

    def _first(self, fn: Callable[[], T], local: bool, then_others: bool) -> T | None:
        if not self.active:
            return fn()
        first = self.local_rank == 0 if local else self.is_main
        result: Any = None
        error = None
        if first:
            try:
                result = fn()
            except LLMRLError as exc:
                error = (type(exc), str(exc), exc.exit_code)
        errors = self.gather_objects(error)
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            kind, message, code = failed
            exc = kind.__new__(kind)
            LLMRLError.__init__(exc, message, code)
            raise exc
        if first or not then_others:
            return result
        return fn()

    # ---- training maths --------------------------------------------------------------------------
    def whiten(self, x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
        """`ops.whiten` over the global batch: (x − μ)/sqrt(σ² + eps) with μ = Σ m x / Σ m and
        σ² = Σ m (x − μ)² / Σ m summed over every rank (biased variance); masked entries become 0."""
        if not self.active:
            return local_whiten(x, mask, eps)
        count, total = self.sum_floats([float(mask.sum()), float(masked_sum(x.double(), mask))])
        mean = total / max(count, 1.0)
        (sq,) = self.sum_floats([float(masked_sum((x.double() - mean) ** 2, mask))])
        var = sq / max(count, 1.0)
        out = ((x.double() - mean) / (var + eps) ** 0.5).to(x.dtype)
        return torch.where(mask, out, torch.zeros_like(out))

    def sum_gradients(self, params: Sequence[torch.nn.Parameter], finite: bool) -> bool:
        """Replace each parameter's `.grad` by its sum over ranks (a missing grad counts as 0) with
        one all-reduce; returns whether every rank's loss was finite (a non-finite rank sends 0s and
        the step is skipped everywhere)."""
        if not self.active or not params:
            return finite
        for p in params:
            if p.grad is None or not finite:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1).float() for p in params] + [torch.tensor([0.0 if finite else 1.0], device=params[0].device)])
        flat = self.sum(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        return bool(flat[-1] == 0)


SINGLE = DistContext()


def _first_words(exc: BaseException, limit: int = 100) -> str:
    """The informative start of a backend error: '[…/pair.cc:537] Read error …' → 'Read error …'."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = text.split("] ", 1)[-1].split(". ")[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def world_from_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside torchrun."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def init(device: str, timeout_s: float) -> DistContext:
    """Join torchrun's process group when WORLD_SIZE > 1 (gloo on CPU; nccl on cuda:LOCAL_RANK)."""
    rank, world, local = world_from_env()
    if world <= 1:
        return SINGLE
    cuda = device != "cpu" and torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise ConfigError("'model.device' is cuda but no CUDA device is available; use cpu or auto.")
    if cuda and local >= torch.cuda.device_count():
        raise ConfigError(f"Process {rank} needs GPU cuda:{local} (one GPU per process on a node) but this node "
                          f"has {torch.cuda.device_count()}; start at most that many processes per node, "
                          f"or set model.device=cpu.")
    if cuda:
        torch.cuda.set_device(local)
    where = torch.device("cuda", local) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                                **({"device_id": where} if cuda else {}))
    return DistContext(rank, world, local, where)


def shutdown(ctx: DistContext) -> None:
    """Leave the process group."""
    if ctx.active and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def distributed(device: str, timeout_s: float) -> Iterator[DistContext]:
    """The run's DistContext; the process group (if any) is torn down when the run ends."""
    ctx = init(device, timeout_s)
    try:
        yield ctx
    finally:
        shutdown(ctx)
