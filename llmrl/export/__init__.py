"""`llmrl export`: a run's trained actor as a standalone model folder with its model card, and its upload.

    merge.py  the actor merged into the base weights (or its PEFT adapter)
    output.py what an export returns, the checks on --out, the temporary sibling folder and its one rename
    reward.py a reward run (`llmrl reward train`) as a merged AutoModelForSequenceClassification of one label
              (or its peft SEQ_CLS adapter); reward_card.py its README.md
    card.py   README.md: base model, library, algorithm, the settings that shape the result, the
              held-out figures the run wrote, the 4-bit base an adapter needs
    names.py  what the card and the adapter's config name: hub ids, never a local path
    hub.py    `--push-to-hub REPO [--private]`: the token checked first, the folder uploaded in one
              commit that deletes the repository's files the folder lacks
"""

from .merge import EXPORT_MARKERS, Exported, check_out, export_run

__all__ = ["EXPORT_MARKERS", "Exported", "check_out", "export_run"]
