"""`llmrl export` writes a model card (README.md) and `--push-to-hub REPO` uploads the folder.

The hub is a stand-in served by this test on 127.0.0.1 (`HF_ENDPOINT`): it answers the requests
huggingface_hub's `create_repo` and `upload_folder` make (repository, README metadata check, pre-upload,
the LFS batch and PUT of the weights, the commit) and keeps what arrived, which must be the export's
bytes. It also holds the files of an earlier push (`files`: the tree a push lists to delete what the
export lacks) and a visibility (`exists`, `private`: what `repo_info` answers). huggingface_hub speaks Xet to the real hub when hf_xet is installed; the stand-in speaks its LFS
protocol, so the pushes here run with HF_HUB_DISABLE_XET=1. No request leaves the machine.

One push runs `python -m llmrl export` in a real subprocess, the environment variables as a user sets them;
the others run the same command in this process (`_export_here`: typer's CliRunner, huggingface_hub's
settings as those variables give them), where a subprocess's start (importing torch, transformers and
peft again: ~10 s of CPU) would be most of each test's time."""

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
import torch
import yaml
from huggingface_hub import ModelCard

from llmrl import load_config, train
from llmrl.export import export_run
from llmrl.export.card import base_model, settings
from llmrl.export.names import public_name
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
            hub.created.append(json.loads(body))
            if hub.exists:  # the hub answers 409 for a repository that exists; exist_ok takes it
                self._answer({"error": "You already created this model repo", "url": f"{base}/{REPO}"}, 409)
            else:
                self._answer({"url": f"{base}/{REPO}"})
        elif path == f"/api/models/{REPO}" and self.command == "GET":
            self._answer({"id": REPO, "private": hub.private})
        elif path == f"/api/models/{REPO}/tree/main" and self.command == "GET":
            self._answer([{"type": "file", "path": f, "size": 1, "oid": "0" * 40} for f in hub.files])
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
    server.created, server.files, server.exists, server.private = [], [], False, False
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


def _export_here(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str | None = None,
                 token: str | None = None) -> tuple[int, str, str]:
    """`llmrl export ARGS` in this process, as `_export` runs it: no stored Hugging Face token (the token file of
    an empty HF_HOME), HF_ENDPOINT `endpoint`, HF_TOKEN `token`, no Xet → (exit code, stdout, stderr).
    huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_DISABLE_XET once, when imported, into its `constants`:
    those are set here to what the variables give (HF_TOKEN it reads at each call). An exception the CLI lets
    escape fails here, as it would print a traceback from a subprocess."""
    from huggingface_hub import constants
    from typer.testing import CliRunner

    from llmrl.cli import app

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)
    home = tmp_path / "hf-home"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint or constants._HF_DEFAULT_ENDPOINT)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, ["export", *args])
    finally:  # the command sets `threads` for its process: the test process keeps its own count
        torch.set_num_threads(threads)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


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
    assert Path(base).is_absolute()  # the card names it by its folder's name only
    assert f"A fine-tune of the local model `{Path(base).name}`, trained with reinforcement learning by llmrl" in text
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


def _texts(folder: Path) -> dict[str, str]:
    """Every file of `folder` that reads as UTF-8 text (the card, the JSON configs, the tokenizer's files)."""
    out = {}
    for f in sorted(folder.rglob("*")):
        try:
            out[f.name] = f.read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            pass
    return out


def test_no_exported_file_names_a_local_path(run_dir: Path, tmp_path: Path,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """The base is the tiny model's folder under pytest's temporary root, where the run is too: neither the
    card nor the adapter's config (peft writes the base's folder as `base_model_name_or_path`) may name
    a path under that root; the adapter points at the base by hub id, or (a local base) by nothing."""
    root = str(tmp_path_factory.getbasetemp())
    for adapter_only in (False, True):
        out = tmp_path / ("adapter" if adapter_only else "merged")
        export_run(run_dir, out, adapter_only=adapter_only)
        texts = _texts(out)
        assert "README.md" in texts and ("adapter_config.json" in texts) == adapter_only
        for name, text in texts.items():
            assert root not in text, (name, text[max(text.index(root) - 200, 0):text.index(root) + 200])
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] is None


SUMS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in zip(range(10, 30), range(40, 60))]
DIGITS = """
def digit_share(prompts, completions, **_):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
"""


def test_a_run_on_local_files_is_named_by_file_name_and_evaluated_prompts_counted(tiny_model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """A dataset of 20 rows holds out 2 (data.eval_fraction 0.1): eval.size 8 asks for more than there are,
    and the card says the 2 the run decoded. The dataset and the reward file are named by file name only."""
    data, reward = tmp_path / "data" / "sums.jsonl", tmp_path / "rewards" / "digits.py"
    data.parent.mkdir()
    reward.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in SUMS))
    reward.write_text(DIGITS)
    run = tmp_path / "run"
    train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(run), "steps": 1,
                                 "data.dataset": str(data), "reward.functions": [f"{reward}:digit_share"]},
                      sets=["data.eval_fraction=0.1", "eval.size=8", "eval.every=0", "rollout.prompts_per_step=4",
                            "update.minibatch_size=4", "rollout.max_new_tokens=4", "threads=1"]))
    export_run(run, tmp_path / "out", adapter_only=True)
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| task | `sums.jsonl` (data.dataset) |" in text and "on `sums.jsonl`, float32 weights" in text, text
    assert "| reward | 1 · `digits.py:digit_share` |" in text and str(tmp_path) not in text
    assert "Greedy decoding of 2 held-out prompts, as the run evaluated them:" in text
    assert json.loads((run / "summary.json").read_text())["eval_prompts"] == 2


def test_a_card_without_the_count_says_at_most(run_dir: Path, tmp_path: Path) -> None:
    """A run from before summary.json recorded `eval_prompts` states eval.size as the bound it is."""
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    summary = json.loads((old / "summary.json").read_text())
    summary.pop("eval_prompts", None)
    (old / "summary.json").write_text(json.dumps(summary))
    export_run(old, tmp_path / "out", adapter_only=True)
    assert "Greedy decoding of at most 8 held-out prompts" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("value, shown", [
    ("/home/me/data/train.jsonl", "train.jsonl"), ("~/data/train.jsonl", "train.jsonl"),
    ("./prompts.csv", "prompts.csv"), ("data/prompts.parquet", "prompts.parquet"),
    ("/home/me/rewards/mine.py:score", "mine.py:score"), ("rewards/mine.py:score", "mine.py:score"),
    ("/home/me/envs/game.py:Game", "game.py:Game"), ("/srv/models/judge/", "judge"), ("a/b/c", "c"),
    ("openai/gsm8k", "openai/gsm8k"), ("my_pkg.rewards:politeness", "my_pkg.rewards:politeness"),
    ("rg:chain_sum", "rg:chain_sum"), ("numeric", "numeric"), ("calculator", "calculator"),
])
def test_public_names(value: str, shown: str) -> None:
    assert public_name(value) == shown


def test_settings_name_an_environment_and_a_reward_model_by_their_last_part() -> None:
    config = load_config(overrides={"rollout.env": "/home/me/envs/game.py:Game", "reward.functions": [
        {"model": "/home/me/reward-models/judge", "weight": 0.5}, {"name": "~/r/mine.py:score"}]})
    rows = dict(settings(config))
    assert rows["environment"] == "`game.py:Game`, at most 4 turns"
    assert rows["reward"] == "0.5 · `judge` + 1 · `mine.py:score`"


def test_a_local_copy_is_named_by_the_hub_id_it_came_from(tmp_path: Path) -> None:
    """`llmrl models get`'s folder (its llmrl-model.json) is its catalogued upstream; a snapshot of the
    hub's cache its ORG/NAME; any other folder its own name, with no base_model."""
    got = tmp_path / "cache" / "models" / "qwen2.5-coder-0.5b-instruct"
    got.mkdir(parents=True)
    (got / "llmrl-model.json").write_text(json.dumps({"name": "qwen2.5-coder-0.5b-instruct"}))
    repo, text, licence = base_model(str(got))
    assert (repo, licence) == ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "apache-2.0") and str(tmp_path) not in text
    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    repo, text, _ = base_model(str(snapshot))
    assert repo == "HuggingFaceTB/SmolLM2-135M-Instruct" and str(tmp_path) not in text
    mine = tmp_path / "home" / "me" / "my-model"
    mine.mkdir(parents=True)
    assert base_model(str(mine)) == (None, "the local model `my-model`", None)


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
    assert len(hub.created) == 1 and "visibility" not in hub.created[0]  # the hub's default (public)


def _ops(commit: list[dict]) -> dict[str, set[str]]:
    """A commit's paths by operation: {'file': …, 'lfsFile': …, 'deletedFile': …}."""
    out: dict[str, set[str]] = {}
    for op in commit[1:]:
        out.setdefault(op["key"], set()).add(op["value"]["path"])
    return out


def test_a_push_deletes_what_an_earlier_push_left_and_nothing_local(run_dir: Path, tmp_path: Path,
                                                                    hub: ThreadingHTTPServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository holds an earlier adapter push: a merged push's commit deletes the adapter's files
    (which the export lacks) and keeps .gitattributes; every local file stays."""
    hub.exists = True
    hub.files = [".gitattributes", "README.md", "adapter_config.json", "adapter_model.safetensors", "extra/notes.txt"]
    out, beside = tmp_path / "pushed", tmp_path / "adapter_config.json"
    beside.write_text("{}")  # a local file of the same name as a deleted one, next to the export
    code, _, err = _export_here([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path, monkeypatch,
                                f"http://127.0.0.1:{hub.server_port}", TOKEN)
    assert code == 0, err
    ops = _ops(hub.commit)
    assert ops["deletedFile"] == {"adapter_config.json", "adapter_model.safetensors", "extra/notes.txt"}, ops
    local = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert ops["file"] | ops["lfsFile"] == local and "model.safetensors" in local
    assert beside.read_text() == "{}" and (out / "README.md").is_file()


def test_private_makes_a_private_repository(run_dir: Path, tmp_path: Path, hub: ThreadingHTTPServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hub.private = True  # what repo_info answers once the repository was made private
    code, _, err = _export_here([str(run_dir), "--out", str(tmp_path / "o"), "--adapter-only", "--push-to-hub", REPO,
                                 "--private"], tmp_path, monkeypatch, f"http://127.0.0.1:{hub.server_port}", TOKEN)
    assert code == 0, err
    assert hub.created == [{"name": "tiny-rl", "organization": "someone", "visibility": "private", "type": "model"}]
    assert "adapter_model.safetensors" in _ops(hub.commit)["lfsFile"]


def test_private_onto_an_existing_public_repository_is_refused(run_dir: Path, tmp_path: Path,
                                                               hub: ThreadingHTTPServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """create_repo leaves an existing repository's visibility as it is: --private would publish."""
    hub.exists, hub.private = True, False
    out = tmp_path / "o"
    code, _, err = _export_here([str(run_dir), "--out", str(out), "--adapter-only", "--push-to-hub", REPO, "--private"],
                                tmp_path, monkeypatch, f"http://127.0.0.1:{hub.server_port}", TOKEN)
    assert code == 1 and "Traceback" not in err, err
    assert err.strip() == (f"error: Did not push: '{REPO}' already exists on the hub at http://127.0.0.1:"
                                   f"{hub.server_port} and is public, and --private does not change an existing "
                                   f"repository; make it private there or push without --private; the export is in "
                                   f"'{out}'.")
    assert not hub.commit and (out / "adapter_config.json").is_file()


def test_private_without_a_push_is_one_sentence(run_dir: Path, tmp_path: Path) -> None:
    cli_refused(["export", str(run_dir), "--out", str(tmp_path / "o"), "--private"],
                "--private sets the visibility of the repository --push-to-hub makes")
    assert not (tmp_path / "o").exists()


def test_no_token_is_one_sentence_before_any_export(run_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _export_here([str(run_dir), "--out", str(tmp_path / "o"), "--push-to-hub", REPO], tmp_path,
                                monkeypatch)
    assert code == 2 and "Traceback" not in err, err
    assert err.strip() == ("error: --push-to-hub needs a Hugging Face token that may write to the repository: "
                                   "set HF_TOKEN or run `hf auth login`; nothing was exported.")
    assert not (tmp_path / "o").exists()


def test_an_unreachable_hub_is_one_sentence_and_the_export_stays(run_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "o"
    code, _, err = _export_here([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path, monkeypatch,
                                f"http://127.0.0.1:{port}", TOKEN)
    assert code == 1 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Could not reach the hub at http://127.0.0.1:{port} ("), lines
    assert lines[0].endswith(f"; the export is in '{out}'.")
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_a_refused_write_is_one_sentence(run_dir: Path, tmp_path: Path, hub: ThreadingHTTPServer,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    hub.refuse = True
    out = tmp_path / "o"
    code, _, err = _export_here([str(run_dir), "--out", str(out), "--push-to-hub", REPO], tmp_path, monkeypatch,
                                f"http://127.0.0.1:{hub.server_port}", TOKEN)
    assert code == 1 and "Traceback" not in err, err
    assert err.strip() == (f"error: Could not push to the hub at http://127.0.0.1:{hub.server_port}: it refused "
                                   f"to let this token write to '{REPO}' (HTTP 403); use a token with write access; "
                                   f"the export is in '{out}'.")
    assert (out / "model.safetensors").is_file() and not hub.commit


def test_a_repository_id_that_is_none(run_dir: Path, tmp_path: Path) -> None:
    cli_refused(["export", str(run_dir), "--out", str(tmp_path / "o"), "--push-to-hub", "a/b/c"],
                "--push-to-hub 'a/b/c' is not a hub repository id")
    assert not (tmp_path / "o").exists()
