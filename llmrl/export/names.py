"""What an export names: the base model, the dataset, the environment and the rewards as a reader of a
pushed card can use the names, never as paths on the machine that trained the run.

    built-in, catalogued or hub name, `module:function`   as written
    a local file or folder                                its last part only: /home/me/data/train.jsonl → train.jsonl
    `path/to/file.py:name`                                file.py:name
    a local model folder                                  the hub id it came from where llmrl knows it, else its name

llmrl knows where a local model folder came from when it is `llmrl models get`'s copy (its
llmrl-model.json names a catalogued model, whose upstream is the hub id) or a snapshot of the hub's
own cache (`…/models--ORG--NAME/snapshots/REVISION` → ORG/NAME). An `--adapter-only` export's
adapter_config.json points at the base by `base_model_name_or_path`; peft writes the folder the base
was loaded from there (for a 4-bit run, llmrl's private cached copy), `point_adapter` writes the hub
id or null instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import tasks as _tasks  # noqa: F401 (registers the built-in models `base_model` names)
from ..models.catalog import CATALOG
from ..models.load import BUILTIN_MODELS
from ..models.obtain import MARKER as OBTAINED

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
HUB_CACHE = re.compile(r"models--([\w.-]+)--([\w.-]+)")  # huggingface_hub's cache folder of ORG/NAME
FILE_SUFFIXES = (".py", ".jsonl", ".json", ".csv", ".parquet", ".gguf", ".safetensors", ".bin")


def is_local(value: str) -> bool:
    """Whether `value` names a path on this machine rather than a hub id or a built-in: absolute, under
    ~ or ., a file by its suffix, more than one `/`, or a path that exists here."""
    return (value.startswith(("/", "~", ".", "\\")) or value.lower().endswith(FILE_SUFFIXES)
            or value.count("/") > 1 or "\\" in value or Path(value).expanduser().exists())


def public_name(value: str) -> str:
    """`value` as a card may name it: a local path by its last part, `path/file.py:name` as `file.py:name`,
    anything else as written."""
    target, sep, attr = value.rpartition(":")
    if sep and target and attr and "/" not in attr and is_local(target):
        return f"{_last_part(target)}:{attr}"
    return _last_part(value) if is_local(value) else value


def _last_part(path: str) -> str:
    p = Path(path.replace("\\", "/")).expanduser()
    return p.name or p.resolve().name or path


def hub_origin(folder: Path) -> str | None:
    """The hub id a local model folder came from, where llmrl can tell (the module docstring), else None."""
    try:
        record = json.loads((folder / OBTAINED).read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("name") in CATALOG:
        return CATALOG[record["name"]].upstream
    found = HUB_CACHE.fullmatch(folder.parent.parent.name) if folder.parent.name == "snapshots" else None
    return f"{found.group(1)}/{found.group(2)}" if found else None


def base_model(name: str) -> tuple[str | None, str, str | None]:
    """(the hub repository for the metadata or None, how the text names the base, its licence or None)."""
    if name in BUILTIN_MODELS:
        return None, f"llmrl's built-in `{name}` model (not on the hub)", None
    if name in CATALOG:
        m = CATALOG[name]
        return m.upstream, f"[{m.upstream}](https://huggingface.co/{m.upstream}) ({m.title} from {m.source}, " \
                           f"de-quantised to float32 by `llmrl models get`)", m.licence.lower()
    if HUB_ID.fullmatch(name) and not Path(name).expanduser().exists() and not name.endswith(".gguf"):
        return name, f"[{name}](https://huggingface.co/{name})", None
    origin = hub_origin(Path(name).expanduser())
    catalogued = [k for k, m in CATALOG.items() if m.upstream == origin]
    if catalogued and (Path(name).expanduser() / OBTAINED).is_file():
        return base_model(catalogued[0])
    if origin:
        return origin, f"[{origin}](https://huggingface.co/{origin}) (a local copy)", None
    return None, f"the local model `{public_name(name)}`", None


def point_adapter(folder: Path, model_name: str) -> None:
    """Make `folder/adapter_config.json` (where there is one) point at the base by its hub id, or by
    nothing (null) where the base is not on the hub: never by a local path."""
    path = folder / "adapter_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base_model(model_name)[0]
    path.write_text(json.dumps(config, indent=2, sort_keys=True))
