"""The docs (README.md and the pages in docs/, built as a site by MkDocs) document every command,
flag and config key as the code has them; every relative link between them points at a file
that exists, and the site builds with no broken link or anchor."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

from batchscale.cli import build_parser
from batchscale.config import reference_markdown

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
PAGES = {path: path.read_text()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
DOCS = "\n".join(PAGES.values())


def test_readme_gives_the_two_setup_commands():
    assert "make local-run" in README and "make test" in README


def test_config_reference_is_current():
    """Regenerate docs/config.md's table with `batchscale config reference` when a config field
    changes."""
    assert reference_markdown().strip() in (ROOT / "docs" / "config.md").read_text()


def _commands() -> argparse.Action:
    return next(a for a in build_parser()._actions if a.dest == "command")


def test_every_command_is_documented():
    for name in _commands().choices:
        assert f"batchscale {name}" in DOCS, name


def test_every_command_and_argument_has_help():
    commands = _commands()
    assert {c.dest for c in commands._choices_actions if c.help} == set(commands.choices)
    for name, parser in commands.choices.items():
        for action in parser._actions:
            assert action.help, (name, action.option_strings or action.dest)


def test_every_flag_is_documented():
    """Each flag that `batchscale <cmd> --help` lists appears in the docs."""
    for name, parser in _commands().choices.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # an old spelling, listed in the README's table of renamed flags
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert re.search(rf"[`\s\[]{flag}\b(?!-)", DOCS), (name, flag)


def test_the_readme_is_a_short_front_page():
    """What it is, the two commands, a tour of one answer; topics live in docs/."""
    assert len(README.splitlines()) <= 250


def test_relative_links_point_at_files_that_exist():
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / target).exists(), (page.name, target)



def test_the_docs_site_builds_strictly(tmp_path):
    """`mkdocs build --strict` over docs/ (mkdocs.yml): a link to a missing page or anchor, or
    a page left out of the navigation, fails the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "your-model" / "index.html").exists()


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f": {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"
