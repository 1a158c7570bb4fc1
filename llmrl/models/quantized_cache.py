"""A 4-bit base quantised once: later runs load the cached 4-bit checkpoint instead of the float one.

Quantising reads every float weight of the checkpoint, and transformers reads a safetensors file
through one memory mapping that it keeps open for the tensors it did not convert, so a run that
quantised Qwen2.5-Coder-1.5B (a 7.1 GB float32 file) carries 5.9 GB of the file's page cache in its
RSS and in its memory cgroup's usage for as long as it lives, and spends ~50 s on the quantising
itself on a 2-core CPU. The first run that loads a local model folder with `model.quantize` set
therefore writes the quantized model with `save_pretrained` (bitsandbytes' own 4-bit serialisation:
codes, absmax scales and their nested state; the unquantized embedding, LM head and norms in
`model.dtype`), and every later run loads that:

    $LLMRL_CACHE_DIR (default ~/.cache/llmrl) / quantized / <folder's name>-<kind>-<dtype>-<key: 12 hex>/

The copy holds the very codes and scales the first run computed, so a run on it computes what the
first run computed (tests/test_quantized_cache.py: identical logits).

The key is a digest of what the copy depends on: `kind`, `dtype`, and the contents of every file of
the folder that the copy is made from or holds: config.json, generation_config.json (the stop
tokens' source: the copy holds its own copy of it), a weight index, *.py (remote code, which
`save_pretrained` copies beside the weights) and the weight files (*.safetensors, *.bin). The
tokenizer is read from the float folder on every run, so its files are not keyed. A file is keyed by
the sha256 of all its bytes, so an edit, or another checkpoint copied in with the old sizes and mtimes
(`cp -p`, `rsync -a`), gives another key, and a `touch` (or the same files in a folder of the same name) the same one.
Hashing a weight file is one pass over it (docs/quantized.md has the seconds), so its digest is
remembered in `quantized/digests.json` against the file's device, inode, size, mtime and ctime, and
the file hashed again only when one of them changes: the kernel sets ctime at every write, rename or
utime, and no copying tool can set it back, so a remembered digest is never that of other bytes.

The folder appears only through an atomic rename of a finished temporary folder
`.<copy>.tmp-PID-HEX`, written under the copy's flock (`obtain.holding`); the writer first deletes
the temporary folders a killed writer left (`obtain.sweep`, as `llmrl models get` does), and a
second run that quantised the same model meanwhile finds the copy there and keeps it. Where the copy
cannot be written (a full disk, a read-only cache) the run goes on from the model it quantised and
says so once. A copy that fails to load is deleted only when it is the copy's fault (`damage`: a
file missing, cut short or not what its header says: one line, deleted, quantised again); a failure
of anything else (memory, a device, transformers, the process's file table) is raised and the copy
kept. A hub id (no local folder) is not cached: transformers keeps its own copy of the float files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from contextlib import suppress
from pathlib import Path

from transformers import AutoModelForCausalLM, PreTrainedModel

from ..config.cache import cache_root, quantized_copy_dir
from .obtain import holding, sweep
from .tiny import no_hf_progress_bars

COMPLETE = "llmrl-quantized.json"  # written last inside the temporary folder: its presence marks a whole copy
DIGESTS = "digests.json"  # beside the copies: weight files' sha256 against their stat (`file_digest`)
KEYED = ("config.json", "generation_config.json", "*.index.json", "*.py", "*.safetensors", "*.bin")
REMEMBERED = (".safetensors", ".bin")  # the large files, whose digests are remembered


def keyed_files(folder: Path) -> list[Path]:
    """The files of `folder` a 4-bit copy depends on (the module docstring), sorted by name."""
    return sorted({f for pattern in KEYED for f in folder.glob(pattern) if f.is_file()}, key=lambda f: f.name)


def _stat_key(f: Path) -> list[int]:
    st = f.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(f: Path, remembered: dict) -> str:
    """sha256 of every byte of `f`; for a weight file, the one in `remembered` (path → stat and digest)
    while its device, inode, size, mtime and ctime are those it was hashed with (updated otherwise)."""
    if f.suffix not in REMEMBERED:
        return hashlib.sha256(f.read_bytes()).hexdigest()
    path, before = str(f.resolve()), _stat_key(f)
    entry = remembered.get(path)
    if isinstance(entry, dict) and entry.get("stat") == before and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    with open(f, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    if _stat_key(f) == before:  # not written while it was read
        remembered[path] = {"stat": before, "sha256": digest}
    return digest


def _read_digests(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_digests(path: Path, remembered: dict) -> None:
    """Best effort (another run may write it too; a lost entry is only hashed again)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({k: v for k, v in remembered.items() if Path(k).exists()}, indent=0) + "\n")
        os.replace(tmp, path)
    except OSError:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)


def copy_key(folder: Path, kind: str, dtype: str) -> str:
    """12 hex of sha256 over `kind`, `dtype` and each keyed file's name and digest."""
    digests = cache_root() / "quantized" / DIGESTS
    remembered = _read_digests(digests)
    before = dict(remembered)
    parts = [kind, dtype] + [f"{f.name}:{file_digest(f, remembered)}" for f in keyed_files(folder)]
    if remembered != before:
        _write_digests(digests, remembered)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def cache_dir(source: str, kind: str, dtype: str) -> Path | None:
    """The cache folder of the 4-bit copy of `source`, or None where `source` is no local model folder
    (or its files cannot be read: then the load itself says what is wrong)."""
    folder = Path(source)
    if not (folder / "config.json").is_file():
        return None
    try:
        return quantized_copy_dir(folder.resolve().name, kind, dtype, copy_key(folder, kind, dtype))
    except OSError:
        return None


def cached(source: str, kind: str, dtype: str) -> Path | None:
    """The folder of a finished 4-bit copy of `source`, or None where there is none yet."""
    folder = cache_dir(source, kind, dtype)
    return folder if folder is not None and (folder / COMPLETE).is_file() else None


def record(model: PreTrainedModel) -> dict | None:
    """What the marker of the copy `model` was loaded from says (source, kind, dtype, device), or None
    where it was not loaded from a copy (quantised from the float checkpoint)."""
    try:
        found = json.loads((Path(str(model.name_or_path)) / COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def damage(folder: Path) -> str | None:
    """What makes the copy in `folder` unreadable, in a few words, or None where its files are whole:
    config.json, generation_config.json and a weight index parse as JSON, the index's files are there,
    and each .safetensors file is 8 bytes of header length n, n bytes of JSON header, then exactly the
    bytes its tensors' offsets end at. OSError where a file cannot be opened (a full file table, a
    permission): that is no proof of damage."""
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    for f in [folder / "config.json", folder / "generation_config.json", *sorted(folder.glob("*.index.json"))]:
        try:
            tree = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
        except (ValueError, UnicodeDecodeError):
            return f"{f.name} is not JSON"
        shards = tree.get("weight_map", {}) if isinstance(tree, dict) else {}
        missing = sorted({s for s in (shards.values() if isinstance(shards, dict) else []) if not (folder / str(s)).is_file()})
        if missing:
            return f"{f.name} names {missing[0]}, which is missing"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "it holds no .safetensors file"
    return next((f"{f.name} {why}" for f in weights if (why := _safetensors_damage(f))), None)


def _safetensors_damage(path: Path) -> str | None:
    """What is wrong with one safetensors file's layout, or None (the module's `damage`)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= size - 8:
            return "has no whole header (cut short, or not a safetensors file)"
        try:
            header = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError, KeyError, IndexError):
            return "has a header that is not a safetensors header"
    if 8 + n + end != size:
        return f"holds {size:,} bytes where its header ends at {8 + n + end:,} (cut short or altered)"
    return None


def load(folder: Path, **kwargs) -> PreTrainedModel | None:
    """The 4-bit model of the copy in `folder`; None where the copy itself is damaged (`damage`): then one
    line on stderr and the copy, which llmrl wrote, is deleted, so this run quantises afresh and writes
    it again. Any other failure (memory, a device, transformers, the file table) is raised, the copy kept."""
    try:
        return AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    except Exception:
        try:
            why = damage(folder)
        except OSError:  # the check could not read the files either: no proof against the copy
            why = None
        if why is None:
            raise
    print(f"llmrl: the cached 4-bit copy {folder} cannot be read ({why}); quantising the float checkpoint again.",
          file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return None


def store(model: PreTrainedModel, source: str, kind: str, dtype: str) -> Path | None:
    """Write the 4-bit `model` (just quantised from `source`) to its cache folder under the copy's lock,
    after sweeping a killed writer's temporary folders; returns the folder (also where another run wrote
    it meanwhile), or None where `source` is not cached or the copy could not be written (one line)."""
    out = cache_dir(source, kind, dtype)
    if out is None:
        return None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with holding(out, lambda: print(f"llmrl: waiting for another run to finish writing {out}.", file=sys.stderr)):
            sweep(out)
            if not (out / COMPLETE).is_file():
                _write(model, source, kind, dtype, out)
    except Exception as exc:  # a best-effort copy: a disk, a permission or a serialisation failure never stops the run
        text = str(exc).strip()
        reason = getattr(exc, "strerror", None) or (text.splitlines()[0][:200] if text else type(exc).__name__)
        print(f"llmrl: the {kind} copy of '{source}' could not be cached in {out.parent} ({reason}); "
              "the next run quantises the float checkpoint again.", file=sys.stderr)
        return None
    return out


def _write(model: PreTrainedModel, source: str, kind: str, dtype: str, out: Path) -> None:
    """save_pretrained into `.NAME.tmp-PID-HEX` beside `out`, the marker last, then one rename."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with no_hf_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)
        (tmp / COMPLETE).write_text(json.dumps({"source": str(Path(source).resolve()), "quantize": kind,
                                                 "dtype": dtype, "device": model.device.type}) + "\n")
        try:
            os.rename(tmp, out)
        except OSError:  # a writer that takes no lock (an older llmrl) finished the same copy first: keep theirs
            if not (out / COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
