"""The README documents every command and every config key as the code has them."""

from pathlib import Path

from batchscale.cli import build_parser
from batchscale.config import reference_markdown

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_gives_the_two_setup_commands():
    assert "make local-run" in README and "make test" in README


def test_config_reference_is_current():
    """Regenerate with `batchscale config reference` when a config field changes."""
    assert reference_markdown().strip() in README


def test_every_command_is_documented():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in commands:
        assert f"batchscale {name}" in README, name
