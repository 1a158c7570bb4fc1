"""Advantage estimators, registered by name (see `registry.py`).

Importing this package registers the built-ins: reinforce, reinforce_baseline, a2c, gae, grpo,
dr_grpo, rloo, remax, reinforce_pp, reinforce_pp_baseline.
"""

from . import bootstrap, group, monte_carlo, reinforce_pp  # noqa: F401  (registration side effects)
from .registry import (
    ESTIMATORS,
    EstimatorInput,
    EstimatorOutput,
    EstimatorSpec,
    Needs,
    checked_estimate,
    get_estimator,
    import_user_module,
    register,
)

__all__ = [
    "ESTIMATORS",
    "EstimatorInput",
    "EstimatorOutput",
    "EstimatorSpec",
    "Needs",
    "checked_estimate",
    "get_estimator",
    "import_user_module",
    "register",
]
