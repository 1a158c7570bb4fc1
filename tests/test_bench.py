"""bench/ stays the maintained tools the docs' present figures come from (issue 69): at most half of its
6,212 lines of 2026-12-07, every script listed in bench/README.md with the doc figure it produces, every
benchmark in bench/smoke.sh, and the docs that compare with TRL's PPOTrainer name the release measured,
1.12.0, the last that has it (huggingface/trl#7020 removed it in 1.13.0)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
README = (BENCH / "README.md").read_text()
HELPERS = {"gpu_prepare.sh", "gpu_model.py", "gpu_check.sh", "in_cgroup.sh", "smoke.sh"}  # not benchmarks
LIMIT = 3106  # half of bench/'s 6,212 lines before issue 69


def scripts() -> list[Path]:
    """bench/'s .py and .sh files outside results/ and hidden folders (bench/.trl-1.12, virtualenvs)."""
    return sorted(p for p in BENCH.rglob("*") if p.suffix in (".py", ".sh") and p.is_file()
                  and "results" not in p.relative_to(BENCH).parts
                  and not any(part.startswith(".") for part in p.relative_to(BENCH).parts))


def test_bench_is_at_most_half_of_what_it_was() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in scripts())
    assert lines <= LIMIT, f"bench/'s scripts are {lines} lines (at most {LIMIT}): remove a probe whose finding the docs hold"


def test_every_top_level_script_is_in_bench_readmes_list() -> None:
    """Each script at bench/'s top is named in the README's list of kept scripts (above the removed ones);
    contenders/ is vs_trl.py's."""
    kept = README.split("## Removed scripts")[0]
    missing = [p.name for p in scripts() if p.parent == BENCH and f"`{p.name}`" not in kept]
    assert not missing, f"not in bench/README.md's list: {missing}"


def test_each_benchmark_in_the_table_names_a_doc_figure() -> None:
    """Every row of the README's table of kept scripts links the doc page whose figure it produces."""
    rows = [ln for ln in README.split("## Removed scripts")[0].splitlines() if re.match(r"\| `\w+\.(py|sh)` \|", ln)]
    assert rows
    bare = [r.split("|")[1].strip() for r in rows if "](../docs/" not in r]
    assert not bare, f"rows without the doc they produce a figure for: {bare}"


def test_smoke_runs_every_maintained_benchmark() -> None:
    smoke = (BENCH / "smoke.sh").read_text()
    benchmarks = [p.name for p in scripts() if p.parent == BENCH and p.name not in HELPERS]
    missing = [name for name in benchmarks
               if not re.search(rf"bench[/.]{re.escape(name.removesuffix('.py'))}(\.py|\.sh)?\b", smoke)]
    assert not missing, f"bench/smoke.sh does not run: {missing}"


def current_docs() -> list[Path]:
    """The pages that say the present: README.md, docs/*.md but history.md, bench/README.md."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "history.md"),
            BENCH / "README.md"]


def test_docs_comparing_with_trls_ppo_name_its_last_release() -> None:
    """A page that sets llmrl against TRL's PPOTrainer names TRL 1.12.0 and says it is the last with it; no
    page names the release as "1.12" alone."""
    bad = []
    for doc in current_docs():
        text = re.sub(r"\s+", " ", doc.read_text())
        name = doc.relative_to(ROOT)
        if "PPOTrainer" in text and not ("TRL 1.12.0" in text and "huggingface/trl#7020" in text):
            bad.append(f"{name}: compares with PPOTrainer without naming TRL 1.12.0 and huggingface/trl#7020")
        bad += [f"{name}: {m.group(0)!r}" for m in re.finditer(r"TRL 1\.12(?!\.0)\S*", text)]
    assert not bad, "\n".join(bad)
