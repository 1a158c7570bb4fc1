"""Gradient noise across the minibatches of one update, from the gradients the update computes anyway.

Within one rollout batch the update takes M optimizer steps (epochs × minibatches). Let g_m be the
actor's gradient of minibatch m, read before clipping. With ḡ = (1/M) Σ g_m:

    grad_norm_var = (1/(M−1)) Σ_m (‖g_m‖ − mean ‖g‖)²            variance of the minibatch norms
    grad_var      = (1/(M−1)) Σ_m ‖g_m − ḡ‖²                        trace of the gradient covariance
                  = (Σ_m ‖g_m‖² − M ‖ḡ‖²) / (M−1)
    grad_rel_var  = grad_var / ‖ḡ‖²                                 scale-free noise-to-signal ratio

`grad_var` estimates tr Cov[g], the total variance of a minibatch's policy-gradient estimate, which is
what a baseline reduces; `grad_rel_var` divides out the gradient's scale so estimators whose
advantages have different scales compare fairly. Only running sums are kept (one float64 vector per
parameter plus two scalars): no extra backward pass, no effect on the update or on any RNG. The
g_m are taken at slightly different parameters (each step moves them), so these are estimates of
the noise along the update's path, not at one point. With M < 2 they are undefined (None).
"""

from __future__ import annotations

import math

import torch


class GradMoments:
    """Running Σ g_m, Σ ‖g_m‖ and Σ ‖g_m‖² over the minibatch gradients of one update."""

    def __init__(self) -> None:
        self.count = 0
        self.sum_norm = 0.0
        self.sum_sq = 0.0
        self.sum_grad: dict[int, torch.Tensor] = {}

    def add(self, params: list[torch.Parameter]) -> None:
        """Record the current `.grad` of `params` (call before clipping; reads, never writes).
        A non-finite gradient (its step is skipped by the update) is not recorded."""
        grads = [(id(p), p.grad.detach().double()) for p in params if p.grad is not None]
        sq = sum(float(g.pow(2).sum()) for _, g in grads)
        if not math.isfinite(sq):
            return
        for key, g in grads:
            if key in self.sum_grad:
                self.sum_grad[key] += g
            else:
                self.sum_grad[key] = g.clone()
        self.count += 1
        self.sum_norm += math.sqrt(sq)
        self.sum_sq += sq

    def stats(self, role: str) -> dict[str, float | None]:
        """{role}_grad_norm_var, {role}_grad_var, {role}_grad_rel_var (None when fewer than 2 gradients)."""
        keys = [f"{role}_grad_norm_var", f"{role}_grad_var", f"{role}_grad_rel_var"]
        m = self.count
        if m < 2:
            return dict.fromkeys(keys)
        mean_sq = sum(float((s / m).pow(2).sum()) for s in self.sum_grad.values())  # ‖ḡ‖²
        norm_var = max(self.sum_sq - self.sum_norm**2 / m, 0.0) / (m - 1)
        grad_var = max(self.sum_sq - m * mean_sq, 0.0) / (m - 1)
        rel = grad_var / mean_sq if mean_sq > 0 else None
        return dict(zip(keys, [norm_var, grad_var, rel]))
