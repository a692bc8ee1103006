"""``python -m capturer --help`` lists every sub-command, each sub-command has its own --help, and
every ``python -m capturer <sub-command>`` the docs show names a sub-command that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from capturer.__main__ import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capturer", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_help_lists_every_sub_command() -> None:
    r = run("--help")
    assert r.returncode == 0, r.stderr
    listed = re.findall(r"^ +([a-z-]+) {2,}\S", r.stdout.split("sub-commands", 1)[1], re.M)
    assert listed == list(SUBCOMMANDS), listed
    assert "python -m capturer.agent" in r.stdout


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_sub_command_has_its_own_help(name: str) -> None:
    r = run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: capturer {name}"), r.stdout[:200]


def test_every_sub_command_the_docs_show_exists() -> None:
    used: set[str] = set()
    for doc in [ROOT / "README.md", ROOT / "start.sh", *sorted((ROOT / "docs").glob("*.md"))]:
        used |= set(re.findall(r"python -m capturer ([a-z][a-z-]*)\b", doc.read_text()))
    assert used, "no sub-command found in the docs"
    assert used <= set(SUBCOMMANDS), used - set(SUBCOMMANDS)


def test_an_unknown_option_is_refused_with_the_usage() -> None:
    r = run("--no-such-option")
    assert r.returncode == 2 and "usage: capturer" in r.stderr


def test_an_unknown_sub_command_is_refused_naming_the_known_ones() -> None:
    r = run("verfy")
    assert r.returncode == 2 and "unrecognized arguments: verfy" in r.stderr, r.stderr
    assert all(name in r.stderr for name in SUBCOMMANDS), r.stderr


def test_options_before_a_sub_command_are_refused_not_dropped() -> None:
    """``--config x verify`` would otherwise run verify on its default config, silently."""
    r = run("--config", "elsewhere.cfg", "verify")
    assert r.returncode == 2 and "go after it: python -m capturer verify" in r.stderr, r.stderr
