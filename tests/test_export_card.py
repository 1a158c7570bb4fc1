"""`llmrl export` writes a model card (README.md) and `--push-to-hub REPO` uploads the folder.

The hub is a stand-in served by this test on 127.0.0.1 (`HF_ENDPOINT`): it answers the requests
huggingface_hub's `create_repo` and `upload_folder` make (repository, README metadata check, pre-upload,
the LFS batch and PUT of the weights, the commit) and keeps what arrived, which must be the export's
bytes. huggingface_hub speaks Xet to the real hub when hf_xet is installed; the stand-in speaks its LFS
protocol, so the pushes here run with HF_HUB_DISABLE_XET=1. No request leaves the machine."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest
import yaml
from huggingface_hub import ModelCard

from llmrl.export import export_run
from llmrl.export.card import base_model
from tests.helpers import cli_refused
from tests.test_export import run_dir  # noqa: F401 (the module's 3-step PPO run on the tiny model)

ROOT = Path(__file__).resolve().parents[1]
REPO = "someone/tiny-rl"
TOKEN = "hf_stand_in_token"


class StandInHub(BaseHTTPRequestHandler):
    """The few hub endpoints an upload uses; `server.seen` lists (method, path, Authorization)."""

    protocol_version = "HTTP/1.1"

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = b""
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            data += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
            pass
        return data

    def _answer(self, payload: Any, code: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        body, path, hub = self._body(), urlsplit(self.path).path, self.server
        hub.seen.append((self.command, path, self.headers.get("Authorization")))
        base = f"http://127.0.0.1:{hub.server_port}"
        if hub.refuse:  # a token that may read but not write
            self._answer({"error": "You don't have the rights to create a model under this namespace"}, 403)
        elif path == "/api/repos/create":
            self._answer({"url": f"{base}/{REPO}"})
        elif path == "/api/validate-yaml":
            hub.readme = json.loads(body)["content"]
            self._answer({"errors": [], "warnings": []})
        elif path == f"/api/models/{REPO}/preupload/main":
            files = json.loads(body)["files"]
            self._answer({"files": [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors")
                                     else "regular", "shouldIgnore": False} for f in files]})
        elif path == f"/{REPO}.git/info/lfs/objects/batch":
            objects = json.loads(body)["objects"]
            self._answer({"transfer": "basic", "objects": [
                {**o, "actions": {"upload": {"href": f"{base}/lfs/{o['oid']}"}}} for o in objects]})
        elif path.startswith("/lfs/") and self.command == "PUT":
            hub.lfs[path.removeprefix("/lfs/")] = body
            self._answer({})
        elif path == f"/api/models/{REPO}/commit/main":
            hub.commit = [json.loads(line) for line in body.splitlines() if line.strip()]
            self._answer({"commitUrl": f"{base}/{REPO}/commit/{'0' * 40}", "commitOid": "0" * 40})
        else:
            self._answer({"error": f"the stand-in has no {self.command} {path}"}, 404)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    server.seen, server.lfs, server.commit, server.readme, server.refuse = [], {}, [], None, False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _export(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`llmrl export ARGS` in a real subprocess with no stored Hugging Face token and `env` added."""
    full = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT")}
    full.update(PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1", **env)
    return subprocess.run([sys.executable, "-m", "llmrl", "export", *args], capture_output=True, text=True, env=full,
                          timeout=600)


def test_the_card_names_base_library_algorithm_settings_and_held_out_figures(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    export_run(run_dir, out)
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "llmrl" and card.data.pipeline_tag == "text-generation"
    assert card.data.tags == ["llmrl", "reinforcement-learning", "ppo", "transformers"]
    assert card.data.base_model is None  # a local folder is no hub repository
    summary = json.loads((run_dir / "summary.json").read_text())
    text = card.text
    # the figures are summary.json's, formatted as the card formats them (accuracy in %, others 4 digits)
    acc = f"| accuracy | {summary['eval_accuracy_before']:.1%} | {summary['eval_accuracy_after']:.1%} |"
    reward = f"| reward | {summary['eval_reward_before']:.4g} | {summary['eval_reward_after']:.4g} |"
    eos = f"| eos_rate | {summary['eval_eos_rate_before']:.1%} | {summary['eval_eos_rate_after']:.1%} |"
    assert acc in text and reward in text and eos in text, text
    assert "| metric | base (step 0) | step 3 |" in text and "Greedy decoding of 8 held-out prompts" in text
    # the fixture's settings: ppo on `digits`, 8 prompts × 1 sample, lr 1e-2, norms trained as modules_to_save
    for row in ("| task | `digits` |", "| algorithm | `ppo` (Schulman et al. 2017 (PPO); GAE: Schulman et al. 2016) |",
                "| advantage estimator | `gae` |", "| steps | 3 |", "| prompts × samples per step | 8 × 1 |",
                "| learning rate (actor) | 0.01, constant |", "| seed | 0 |"):
        assert row in text, (row, text)
    base = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["name"]  # the tiny model's folder
    assert f"A fine-tune of the local model `{base}`, trained with reinforcement learning by llmrl" in text
    lora = yaml.safe_load((run_dir / "config.yaml").read_text())["lora"]
    assert f"| LoRA | r {lora['r']}, α {lora['alpha']:g}, dropout 0, modules_to_save norm |" in text
    assert "float32 weights of step 3 of 3 (from the run's adapter)" in text


def test_a_checkpoint_without_an_evaluation_says_so(run_dir: Path, tmp_path: Path) -> None:
    """Exported from step 2 of 3, which the run never evaluated (eval.every=0): no figures are borrowed
    from the final actor; the base's are named."""
    partial = tmp_path / "partial"
    shutil.copytree(run_dir, partial)
    shutil.rmtree(partial / "adapters")
    shutil.rmtree(partial / "checkpoints" / "step-000003")
    export_run(partial, tmp_path / "from-2", adapter_only=True)
    card = ModelCard.load(tmp_path / "from-2" / "README.md")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert card.data.tags[-1] == "peft" and "PeftModel.from_pretrained(base, THIS_FOLDER)" in card.text
    assert "weights of step 2 of 3 (from the run's checkpoint)" in card.text
    assert (f"The run wrote no held-out evaluation of the weights of step 2 (the base's: accuracy "
            f"{summary['eval_accuracy_before']:.1%}, reward {summary['eval_reward_before']:.4g},") in card.text
    assert "| metric |" not in card.text


@pytest.mark.parametrize("name, repo, licence", [
    ("tiny", None, None),  # built in: not on the hub
    ("qwen2.5-coder-0.5b-instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "apache-2.0"),  # catalogued: its upstream
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", None),  # a hub id
    ("models/base.gguf", None, None),  # a file
])
def test_base_model_metadata(name: str, repo: str | None, licence: str | None) -> None:
    got, _, lic = base_model(name)
    assert (got, lic) == (repo, licence)


def test_a_local_folder_that_looks_like_a_hub_id_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert base_model("org/model")[0] is None


def test_push_to_a_stand_in_hub(run_dir: Path, tmp_path: Path, hub: ThreadingHTTPServer) -> None:
    out = tmp_path / "pushed"
    endpoint = f"http://127.0.0.1:{hub.server_port}"
    done = _export([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path, HF_ENDPOINT=endpoint,
                   HF_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    said = "".join(done.stdout.split())  # rich wraps long lines, inside words too
    assert f"Pushedto{REPO}:{endpoint}/{REPO}/commit/{'0' * 40}" in said, done.stdout
    # the upload's requests (huggingface_hub also GETs a registry of its own, /api/agent-harnesses: a 404 here)
    calls = [(method, path) for method, path, _ in hub.seen if method != "GET"]
    assert calls[0] == ("POST", "/api/repos/create") and calls[-1] == ("POST", f"/api/models/{REPO}/commit/main")
    assert set(calls[1:-1]) == {("POST", "/api/validate-yaml"), ("POST", f"/api/models/{REPO}/preupload/main"),
                                ("POST", f"/{REPO}.git/info/lfs/objects/batch"),
                                *[("PUT", f"/lfs/{oid}") for oid in hub.lfs]}, calls
    assert all(auth == f"Bearer {TOKEN}" for method, path, auth in hub.seen if method == "POST"), hub.seen
    # every file of the export arrived, byte for byte: small ones in the commit, the weights through LFS
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    header, *ops = hub.commit
    assert header["key"] == "header" and "llmrl export of the run run" in header["value"]["summary"]
    got = {}
    for op in ops:
        value = op["value"]
        if op["key"] == "file":
            got[value["path"]] = base64.b64decode(value["content"])
        else:
            assert op["key"] == "lfsFile" and value["algo"] == "sha256"
            got[value["path"]] = hub.lfs[value["oid"]]
            assert hashlib.sha256(got[value["path"]]).hexdigest() == value["oid"]
    assert got == local and "model.safetensors" in got and "README.md" in got
    assert hub.readme == local["README.md"].decode() and "library_name: llmrl" in hub.readme


def test_no_token_is_one_sentence_before_any_export(run_dir: Path, tmp_path: Path) -> None:
    done = _export([str(run_dir), "--out", str(tmp_path / "o"), "--push-to-hub", REPO], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("error: --push-to-hub needs a Hugging Face token that may write to the repository: "
                                   "set HF_TOKEN or run `hf auth login`; nothing was exported.")
    assert not (tmp_path / "o").exists()


def test_an_unreachable_hub_is_one_sentence_and_the_export_stays(run_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "o"
    done = _export([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path,
                   HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_TOKEN=TOKEN)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Could not reach the hub at http://127.0.0.1:{port} ("), lines
    assert lines[0].endswith(f"; the export is in '{out}'.")
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_a_refused_write_is_one_sentence(run_dir: Path, tmp_path: Path, hub: ThreadingHTTPServer) -> None:
    hub.refuse = True
    out = tmp_path / "o"
    done = _export([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path,
                   HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}", HF_TOKEN=TOKEN)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (f"error: Could not push to the hub at http://127.0.0.1:{hub.server_port}: it refused "
                                   f"to let this token write to '{REPO}' (HTTP 403); use a token with write access; "
                                   f"the export is in '{out}'.")
    assert (out / "model.safetensors").is_file() and not hub.commit


def test_a_repository_id_that_is_none(run_dir: Path, tmp_path: Path) -> None:
    cli_refused(["export", str(run_dir), "--out", str(tmp_path / "o"), "--push-to-hub", "a/b/c"],
                "--push-to-hub 'a/b/c' is not a hub repository id")
    assert not (tmp_path / "o").exists()
