"""The guides cannot drift from the code: every command the README and configs/README.md show
parses into its config (the checks of `rlhfkit <command> --print_config` and more: the
config's own), every config in `configs/` is listed in configs/README.md, and every relative
link and anchor in the project's markdown resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlhfkit import cli

ROOT = Path(__file__).resolve().parents[1]
GUIDES_WITH_COMMANDS = ("README.md", "configs/README.md")
MARKDOWN = [
    ROOT / "README.md",
    ROOT / "configs" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "benchmarks").rglob("*.md")),
    ROOT / "src" / "rlhfkit" / "assets" / "README.md",
]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def shown_commands(path: Path) -> list[str]:
    """The `rlhfkit` commands a page shows with options, in code blocks and inline code: the
    part from the command's name on (after `rlhfkit`, or `-m rlhfkit.cli` under a launcher),
    without the flags before it and the comment after it. A bare name (`rlhfkit sft`) names a
    command rather than shows one; a placeholder (`<command>`, `...`) is not runnable."""
    text = path.read_text(encoding="utf-8")
    pieces = [line for block in FENCE.findall(text) for line in block.splitlines()]
    pieces += re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    found = []
    for piece in pieces:
        for part in piece.split("#", 1)[0].split("&&"):
            match = re.search(r"(?:^|\s)rlhfkit(?:\.cli)?\s+(.*)", part)
            if match is None or "--" not in match.group(1):
                continue
            command = match.group(1).strip()
            if "<" not in command and "..." not in command:
                found.append(command)
    return found


COMMANDS = [
    pytest.param(command, id=f"{page}: {command}")
    for page in GUIDES_WITH_COMMANDS
    for command in shown_commands(ROOT / page)
]


def test_the_guides_show_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shown_parses(command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    words = shlex.split(command)
    while words and words[0] in cli.FLAGS:
        words.pop(0)
    if words[:1] == ["launch"]:  # torchrun's options, then the stage
        words = words[next(i for i, word in enumerate(words) if cli._resolve(word)) :]
    found = cli._command_of(words)
    assert found is not None, f"not a command: {command}"
    name, args = found
    try:
        cli.parse_command(name, args)
    except SystemExit as stop:  # --help prints and exits 0; a parse error exits 2
        assert stop.code == 0, f"{command}: {capsys.readouterr().err}"


def test_configs_readme_lists_every_config():
    listing = (ROOT / "configs" / "README.md").read_text(encoding="utf-8")
    configs = sorted(
        p.relative_to(ROOT / "configs").as_posix() for p in (ROOT / "configs").rglob("*.yaml")
    )
    missing = [c for c in configs if c not in listing]
    assert not missing, f"configs/README.md does not list {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, only letters, digits, spaces, hyphens and
    underscores kept, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated one gets -1, -2, ... as on
    GitHub)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for line in text.splitlines():
        if not re.match(r"#{1,6} ", line):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
