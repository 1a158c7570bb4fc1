"""KL coefficient controllers: a fixed β, or the adaptive one of Ziegler et al. (2019)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KLController:
    """β for the next step.

    Adaptive rule (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences"):
    e = clip(KL / target − 1, −0.2, 0.2);  β ← β · (1 + e · min(n_samples / horizon, 1)).

    The paper (and TRL's AdaptiveKLController) multiply by 1 + e · n/horizon unbounded, which
    with a horizon shorter than a step's samples (kl.horizon=1, n=32: 1 − 0.2·32 = −5.4) turns β
    negative, a KL bonus. Capping n/horizon at 1 keeps the multiplier in [0.8, 1.2], so a positive
    β stays positive and moves by at most 20 % per step.
    """

    beta: float
    adaptive: bool = False
    target: float = 0.1
    horizon: int = 10000

    def update(self, kl: float, n_samples: int) -> None:
        if not self.adaptive:
            return
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * min(n_samples / self.horizon, 1.0)

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta = float(state["beta"])
