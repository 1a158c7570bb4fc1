"""The docs are true to the repository: the README's cheap commands run and print what it says, every
file a doc links to exists (and every anchor of a link to a page), the README's two set-up-to-result
commands are its first screen and `.ci/run`'s test command, docs/performance.md opens with its table,
and no figure the docs held before they were rewritten to say the present (commit 8d3621d) is lost."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]

# `llmrl` sub-commands that answer in seconds without a model or the network
CHEAP = {"--help", "algos", "tasks", "config", "advantages", "losses"}


def code_blocks(text: str) -> list[list[str]]:
    """The lines of every fenced ```bash / ```sh block."""
    blocks, lines, lang = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if lines is None:
                lines, lang = [], line[3:].strip()
            else:
                if lang in ("bash", "sh", "shell"):
                    blocks.append(lines)
                lines = None
        elif lines is not None:
            lines.append(line)
    return blocks


def readme_commands() -> list[tuple[list[str], str | None, str | None]]:
    """Every cheap `llmrl …` line in the README's code blocks: (argv after `llmrl`, stdin, the
    `# …` line the README prints under it as its output, if any)."""
    found = []
    for block in code_blocks(README.read_text()):
        for i, line in enumerate(block):
            stdin = None
            if not line.startswith(("llmrl ", "echo ")):
                continue
            words = shlex.split(line, comments=True)
            if "|" in words:  # `echo 'JSON' | llmrl …`: the echo's text is the command's stdin
                bar = words.index("|")
                if words[:1] != ["echo"] or bar != 2:
                    continue
                stdin, words = words[1] + "\n", words[bar + 1:]
            if words[:1] != ["llmrl"] or len(words) < 2 or words[1] not in CHEAP:
                continue
            nxt = block[i + 1] if i + 1 < len(block) else ""
            expected = nxt[1:].strip() if nxt.startswith("# ") else None
            found.append((words[1:], stdin, expected))
    return found


COMMANDS = readme_commands()


def test_the_readme_shows_the_cheap_commands():
    shown = {argv[0] for argv, _, _ in COMMANDS}
    assert {"--help", "algos", "tasks", "config", "advantages"} <= shown, shown


@pytest.mark.parametrize("argv,stdin,expected", COMMANDS, ids=[" ".join(c[0])[:40] for c in COMMANDS])
def test_readme_command_runs(argv, stdin, expected):
    from typer.testing import CliRunner

    from llmrl.cli import app

    result = CliRunner().invoke(app, argv, input=stdin)
    assert result.exit_code == 0, (argv, result.stdout, result.stderr)
    assert result.stdout.strip(), argv
    if expected is not None and expected.startswith("{"):
        assert json.loads(result.stdout) == json.loads(expected), (result.stdout, expected)


# ---- links -------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a repository path written out in the text, e.g. `bench/results/vs-trl.json` or docs/engines.md
BARE = re.compile(r"(?<![\w./~<:-])((?:docs|bench|recipes|tests|llmrl|\.ci)/[\w./-]*\.(?:md|py|json|png|yaml|sh|txt))(?![\w/])")
# a file removed from the tree, named by a commit that has it: `git show ae998e2:bench/probes/decode_width.py`
AT_COMMIT = re.compile(r"(?<![\w./~<:-])([0-9a-f]{7,40}):((?:docs|bench|recipes|tests|llmrl|\.ci)/[\w./-]*\.(?:md|py|json|png|yaml|sh|txt))(?![\w/])")


def slugs(md: Path) -> set[str]:
    """GitHub's anchors for the headings of a page."""
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    text = doc.read_text()
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{doc.relative_to(ROOT)} links to {path} (missing)")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file):
            bad.append(f"{doc.relative_to(ROOT)} links to {target} (no such heading)")
    return bad + [f"{doc.relative_to(ROOT)} {m}" for m in missing_paths(text)]


def missing_paths(text: str) -> list[str]:
    """The repository paths a text writes out that do not exist: a bare one missing from the tree, or a
    `COMMIT:path` (a file removed, named where it can still be read) that COMMIT does not have. A commit
    this checkout lacks (a shallow clone) is not held against the text."""
    bad = []
    for path in sorted(set(BARE.findall(text))):
        if re.search(r"[A-Z]{2,}", path.replace("README", "")):
            continue  # a placeholder: bench/profile-NAME.json
        if not (ROOT / path).exists():
            bad.append(f"names {path} (missing)")
    for commit, path in sorted(set(AT_COMMIT.findall(text))):
        if re.search(r"[A-Z]{2,}", path.replace("README", "")):
            continue  # a placeholder: ae998e2:bench/probes/NAME.py
        if _git("cat-file", "-e", f"{commit}^{{commit}}") and not _git("cat-file", "-e", f"{commit}:{path}"):
            bad.append(f"names {commit}:{path} (not in that commit)")
    return bad


def _git(*args: str) -> bool:
    """Whether `git ARGS` succeeds in this checkout."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_linked_file_exists(doc):
    bad = broken_links(doc)
    assert not bad, "missing (name a file removed from the tree as COMMIT:path, a commit that has it):\n" + "\n".join(bad)


def test_a_removed_file_is_named_by_a_commit_that_has_it():
    """bench/'s removed probes are cited as `COMMIT:path`: accepted where that commit has the file, refused
    where it does not, and the bare path of a removed file is refused."""
    if not _git("cat-file", "-e", "ae998e2^{commit}"):
        pytest.skip("commit ae998e2 is not in this checkout (a shallow clone)")
    assert missing_paths("`git show ae998e2:bench/probes/decode_width.py`") == []
    assert missing_paths("`git show ae998e2:bench/probes/no_such_probe.py`") == [
        "names ae998e2:bench/probes/no_such_probe.py (not in that commit)"]
    assert missing_paths("`python bench/probes/decode_width.py`") == ["names bench/probes/decode_width.py (missing)"]


# ---- the README's shape and the performance page's -----------------------------------------------

def setup_commands() -> list[tuple[int, str]]:
    lines = README.read_text().splitlines()
    return [(i + 1, line) for i, line in enumerate(lines) if line.startswith("python3 -m venv ")]


def test_readme_has_two_set_up_to_result_commands_on_its_first_screen():
    cmds = setup_commands()
    assert len(cmds) == 2, cmds
    (train_line, train), (_, test) = cmds
    assert train.endswith("llmrl train --algo ppo") and train_line <= 40, cmds
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("python3 -m venv ")]
    assert ci == [test], (ci, test)  # .ci/run runs the README's test command verbatim


def test_performance_opens_with_its_table_and_stays_short():
    lines = (ROOT / "docs" / "performance.md").read_text().splitlines()
    assert len(lines) < 300, len(lines)
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    first_section = next(i for i, ln in enumerate(lines) if ln.startswith("## "))
    assert first_table < first_section


# ---- no figure lost ----------------------------------------------------------------------------

BEFORE = "8d3621d"  # the docs as they stood before they were rewritten to say the present
FIGURE = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*)(\s?(?:%|×|GFLOP/s|GFLOP|tokens/s|s/step|MiB|GiB|MB|GB|KB|ms|s)(?![\w/]))?")


def figures(text: str) -> dict[str, str]:
    """Every number of a text with its unit, if one follows it (`31.2%`, `0.66×`, `221s`, `1670`),
    mapped to the first line it occurs on."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        for number, unit in FIGURE.findall(line.replace("\u202f", " ").replace("\u00a0", " ")):
            out.setdefault(number + (unit or "").strip(), line.strip())
    return out


def old_docs() -> dict[str, str]:
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", BEFORE, "README.md", "docs/"],
                               capture_output=True, text=True, check=True).stdout.split()
        return {n: subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:{n}"], capture_output=True,
                                  text=True, check=True).stdout for n in names if n.endswith(".md")}
    except (OSError, subprocess.CalledProcessError):
        return {}


def test_no_figure_lost():
    """Every figure of README.md and docs/*.md at 8d3621d is still in README.md or docs/*.md: in the
    present pages where it holds, in docs/history.md where it was superseded."""
    old = old_docs()
    if not old:
        pytest.skip(f"commit {BEFORE} is not in this checkout (a shallow clone)")
    now = set()
    for doc in [README, *(ROOT / "docs").glob("*.md")]:
        now |= set(figures(doc.read_text()))
    lost = [f"{name}: {fig!r} in: {line[:120]}" for name, text in old.items()
            for fig, line in figures(text).items() if fig not in now]
    assert not lost, f"{len(lost)} figures lost:\n" + "\n".join(lost)
