"""TRL 1.12's PPOTrainer on vs_trl's configuration, alone: the command line of the `trl-ppo` contender,
whose run and description are in bench/contenders/trl_ppo.py.

    python -m bench.trl_ppo --steps 3 [--threads 2] [--full] [--model PATH]    # from the repo root
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/trl_ppo.py` works too
from bench.contenders.trl_ppo import ensure_trl112, import_trl112, main, trl_ppo_run  # noqa: E402

__all__ = ["ensure_trl112", "import_trl112", "main", "trl_ppo_run"]

if __name__ == "__main__":
    main()
