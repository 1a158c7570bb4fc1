"""Settings a built-in model recommends for itself, applied between the algorithm preset and the
recipe (so a recipe or `--set` still overrides them; `llmrl config` shows the result).

The `tiny` model is 132 K parameters with hidden size 64: its LoRA adapters need a unit scale
(α = r) and the RMSNorm weights trained inside each adapter so that RL can sharpen its output
distribution, whose scale a frozen final norm would otherwise pin.
"""

from __future__ import annotations

from typing import Any

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {
        "lora.r": 8,
        "lora.alpha": 8.0,
        "lora.modules_to_save": ["norm"],
        "update.lr_actor": 1e-3,
        "update.lr_critic": 5e-3,
    },
}


def defaults_for_model(name: str) -> dict[str, Any]:
    """The recommended dotted-key settings of a built-in model ({} for any other model)."""
    return dict(MODEL_DEFAULTS.get(name, {}))
