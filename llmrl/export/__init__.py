"""`llmrl export`: a run's trained actor as a standalone model folder with its model card, and its upload.

    merge.py  the actor merged into the base weights (or its PEFT adapter), written through a temporary
              sibling and one rename
    card.py   README.md: base model, library, algorithm, the settings that shape the result, the
              held-out figures the run wrote
    hub.py    `--push-to-hub REPO`: the token checked first, the folder uploaded in one commit
"""

from .merge import EXPORT_MARKERS, Exported, check_out, export_run

__all__ = ["EXPORT_MARKERS", "Exported", "check_out", "export_run"]
