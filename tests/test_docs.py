"""The README documents every command and every config key as the code has them."""

import argparse
import re
from pathlib import Path

from batchscale.cli import build_parser
from batchscale.config import reference_markdown

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_gives_the_two_setup_commands():
    assert "make local-run" in README and "make test" in README


def test_config_reference_is_current():
    """Regenerate with `batchscale config reference` when a config field changes."""
    assert reference_markdown().strip() in README


def _commands() -> argparse.Action:
    return next(a for a in build_parser()._actions if a.dest == "command")


def test_every_command_is_documented():
    for name in _commands().choices:
        assert f"batchscale {name}" in README, name


def test_every_command_and_argument_has_help():
    commands = _commands()
    assert {c.dest for c in commands._choices_actions if c.help} == set(commands.choices)
    for name, parser in commands.choices.items():
        for action in parser._actions:
            assert action.help, (name, action.option_strings or action.dest)


def test_every_flag_is_in_the_readme():
    """Each flag that `batchscale <cmd> --help` lists appears in the README."""
    for name, parser in _commands().choices.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # an old spelling, listed in the README's table of renamed flags
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert re.search(rf"[`\s\[]{flag}\b(?!-)", README), (name, flag)
