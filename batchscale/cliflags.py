"""Command-line flags generated from the config models: one flag per config field, named after
it (`time_budget_s` -> `--time-budget-s`), with the field's docstring as help. A flag that is
given replaces the field's value in --config, and the result is validated like a config file,
so a bad value is refused naming its field (exit 2).

Numbers on the command line are ASCII decimals within int64 and finite (int() and float() would
also take other scripts' digits, '1_000', 'inf' and 4,000-digit integers); a list takes no empty
item. Output paths are checked before any work (check_output_file, check_output_dir)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from batchscale.config import (
    INT64_MAX,
    ExperimentConfig,
    load_config,
    section_models,
    with_overrides,
)
from batchscale.config.loading import RENAMED_VALUES
from batchscale.errors import BadInput
from batchscale.names import quote, redact_url

# Spellings that flags had before they were named after their config field: still accepted,
# with a note on stderr, until the next release.
OLD_FLAGS = {"torch_compile": "--compile", "image_size_px": "--image-size",
             "memory_limit_bytes": "--memory-limit", "time_budget_s": "--time-budget",
             "lr_rules": "--lr-rule", "lr_candidates": "--lr-grid"}
# What a flag's help adds to its config field's docstring.
FLAG_NOTES = {"workload": "Your own training as 'package.module:name': a batchscale.Workload "
                          "(model, data, loss, metrics), a TrainingLoop (your loop: converge, "
                          "run and analyze take it; the sweep has nothing to time in it), a "
                          "function returning one, or a model factory returning a "
                          "torch.nn.Module (docs/your-model.md). It runs your code with your "
                          "rights, like any Python import; modules of Python's standard "
                          "library are refused."}
ASCII_INTEGER = re.compile(r"[+-]?[0-9]+")
ASCII_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
NOT_FINITE = ("inf", "infinity", "nan")
INT64_DIGITS = len(str(INT64_MAX))
# Items of a list flag: separated by commas (with or without spaces around) or by spaces.
LIST_SEPARATOR = re.compile(r"\s*,\s*|\s+", re.ASCII)
ASCII_SPACE = " \t\n\r\f\v"
"""What a number may be padded with: str.strip() alone would also drop U+0085 or U+3000."""


def flag_for(field: str) -> str:
    """The flag that sets a config field: time_budget_s -> --time-budget-s."""
    return "--" + field.replace("_", "-")


def _accepted_types(annotation) -> list:
    """The types a field accepts, without Annotated metadata and without Optional's None."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        return [t for member in get_args(annotation) for t in _accepted_types(member)
                if t is not type(None)]
    return [annotation]


@dataclass(frozen=True)
class FlagText:
    """How a flag's text becomes a config field's value (the model then validates it)."""

    item: type = str
    """int, float or str: the value's type, or each list item's (sizes like 2GiB stay text)."""
    is_list: bool = False
    """The flag takes values separated by spaces or commas."""
    choices: tuple[str, ...] = ()
    """What each value must be one of (a Literal field)."""
    words: tuple[str, ...] = ()
    """What a list field also takes on its own (sweep.batch_sizes: "auto")."""
    old_choices: tuple[str, ...] = ()
    """Old names of choices, still taken (the config reads them with a note: RENAMED_VALUES)."""

    @classmethod
    def of(cls, annotation) -> FlagText:
        types = _accepted_types(annotation)
        words = tuple(w for t in types if get_origin(t) is Literal for w in get_args(t))
        lists = [t for t in types if get_origin(t) is list]
        if lists:
            item = cls.of(get_args(lists[0])[0])
            return cls(item.item, True, item.choices, words)
        if words:
            return cls(choices=words)
        return cls(types[0] if types[0] in (int, float) else str)

    @property
    def metavar(self) -> str | None:
        if self.choices:
            return "{" + ",".join(self.choices) + "}"
        return {int: "N", float: "X"}.get(self.item)

    def value(self, text: str | list[str]):
        """The field's value from the flag's text (a list of tokens for a list field)."""
        if not self.is_list:
            return self._one(text)
        if any(not token.strip() for token in text):  # e.g. --batch-sizes 1 '' 2
            raise ValueError(f"{quote(' '.join(repr(t) for t in text))} has an empty value; "
                             "give each value, separated by commas or spaces")
        joined = " ".join(text).strip(ASCII_SPACE)
        items = LIST_SEPARATOR.split(joined)
        if "" in items:
            raise ValueError(f"{quote(joined)} has an empty item (two commas in a row, or a "
                             "comma at an end); separate values by one comma or by spaces")
        if len(items) == 1 and items[0] in self.words:
            return items[0]
        return [self._one(piece) for piece in items]

    def _one(self, text: str):
        if self.choices and text not in self.choices + self.old_choices:
            raise ValueError(f"invalid choice: {quote(text)} (choose from "
                             f"{', '.join(self.choices)})")
        if self.item is int:
            return parse_integer(text)
        if self.item is float:
            return parse_number(text)
        return text


def parse_integer(text: str) -> int:
    """An ASCII decimal integer within int64 (ValueError naming the text otherwise)."""
    digits = text.strip(ASCII_SPACE)
    if not ASCII_INTEGER.fullmatch(digits):
        raise ValueError(f"{quote(text)} is not an integer (digits 0-9)")
    if len(digits.lstrip("+-").lstrip("0")) > INT64_DIGITS or abs(int(digits)) > INT64_MAX:
        raise ValueError(f"{quote(text)} is beyond the integers allowed (at most 2**63-1)")
    return int(digits)


def parse_number(text: str) -> float:
    """An ASCII decimal number, finite and within int64's size like every number on the command
    line (ValueError naming the text otherwise)."""
    digits = text.strip(ASCII_SPACE)
    if digits.lower().lstrip("+-") in NOT_FINITE:
        raise ValueError(f"{quote(text)} is not a finite number")
    if not ASCII_DECIMAL.fullmatch(digits):
        raise ValueError(f"{quote(text)} is not a number (digits 0-9, '.', an exponent)")
    value = float(digits)
    if not math.isfinite(value) or abs(value) > INT64_MAX:
        raise ValueError(f"{quote(text)} is beyond the numbers allowed (finite, at most "
                         "2**63-1 in size)")
    return value


def whole_number(text: str) -> int:
    """argparse `type` of a plain integer flag (e.g. history --last)."""
    try:
        return parse_integer(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class Parser(argparse.ArgumentParser):
    """argparse's parser with the command-line conventions: no abbreviated flags (`--batch-size`
    is not taken for `--batch-sizes`), an unknown flag named first, by the command it was given
    to, with that command's usage and the nearest flag, and credentials in URLs redacted from
    error messages (they quote the arguments). Sub-commands get the same class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []
        self._siblings: dict[str, Parser] = {}

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    command._siblings = {other: parser for other, parser
                                         in action.choices.items() if other != name}
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._command_parser(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str):
        # argparse checks required flags before it reports unknown ones: a misspelt flag
        # would read as a missing one.
        unknown = self._unknown_flags()
        if unknown and not message.startswith("unrecognized arguments"):
            message = f"unrecognized arguments: {' '.join(unknown)}"
        if message.startswith("unrecognized arguments"):
            message += self._nearest_hint(unknown)
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            nearest = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]),
                                                n=1, cutoff=0.6)
            message += f"; did you mean {nearest[0]}?" if nearest else ""
        super().error(redact_url(message))

    def _command_parser(self, parsed) -> argparse.ArgumentParser:
        """The parser of the sub-command that was given (itself when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                command = getattr(parsed, action.dest, None)
                if command in action.choices:
                    return action.choices[command]._command_parser(parsed)
        return self

    def _flags(self, visible_only: bool = False) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings
                if not (visible_only and action.help is argparse.SUPPRESS)]

    def _unknown_flags(self) -> list[str]:
        """Flags given to this parser that it does not have (sub-commands excluded: a
        sub-command's parser checks its own)."""
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            given = self._given[:next((i for i, word in enumerate(self._given)
                                       if not word.startswith("-")), len(self._given))]
        else:
            given = self._given
        known = set(self._flags())
        return [word for word in given if re.match(r"^--?[A-Za-z]", word)
                and word.split("=")[0] not in known]

    def _nearest_hint(self, unknown: list[str]) -> str:
        flag = unknown[0].split("=")[0] if unknown else ""
        nearest = difflib.get_close_matches(flag, self._flags(True), n=1, cutoff=0.6)
        if nearest and difflib.SequenceMatcher(None, flag, nearest[0]).ratio() >= 0.8:
            return f"; did you mean {nearest[0]}?"
        command = self._like_named_command_taking(unknown)
        if command:
            return (f"; {flag} is a flag of `{command}`, not of `{self.prog}`: did you mean "
                    f"`{command}`?")
        if nearest:
            return f"; did you mean {nearest[0]}?"
        return f"; `{self.prog} --help` lists its flags"

    def _like_named_command_taking(self, unknown: list[str]) -> str | None:
        """The sibling command named like this one (`batch-schedule` for `schedule`) that
        takes every unknown flag: the likelier slip is the command's name, not the flags."""
        own = self.prog.split()[-1]
        takers = {name: parser for name, parser in self._siblings.items()
                  if unknown and all(word.split("=")[0] in parser._flags(True)
                                     for word in unknown)}
        close = difflib.get_close_matches(own, list(takers), n=1, cutoff=0.6)
        return takers[close[0]].prog if close else None


class _FieldFlag(argparse.Action):
    """Sets a config field from its flag's text."""

    def __init__(self, option_strings, dest, text: FlagText, **kwargs):
        super().__init__(option_strings, dest, nargs="+" if text.is_list else None,
                         metavar=text.metavar, **kwargs)
        self.text = text

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setattr(namespace, self.dest, self.text.value(values))
        except ValueError as err:
            raise argparse.ArgumentError(self, str(err)) from None


class _OldFlag(argparse.Action):
    """A flag's spelling from before it was named after its config field (OLD_FLAGS): it does
    what the new flag does, after a note on stderr; hidden from --help."""

    def __init__(self, option_strings, dest, new: argparse.Action):
        super().__init__(option_strings, dest, nargs=new.nargs, help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        flag = self.new.option_strings[0]
        print(f"batchscale: {option_string} is deprecated and goes in the next release; use "
              f"{flag}", file=sys.stderr)
        self.new(parser, namespace, values, flag)


def _how_many(field) -> str:
    """"One or more", or the list's length bounds where the field sets them ("2 to 8 values")."""
    low = next((m.min_length for m in field.metadata if hasattr(m, "min_length")), None) or 1
    high = next((m.max_length for m in field.metadata if hasattr(m, "max_length")), None)
    if high is None:
        return "One or more" if low == 1 else f"{low} or more"
    return f"{low} to {high} values"


def add_config_flags(parser: argparse.ArgumentParser, section: str | None,
                     fields: list[str]) -> None:
    """A flag per config field of `section` (None: the top level), named after it, with the
    field's docstring as help: bools as --x/--no-x, lists separated by spaces or commas. A flag
    that is given replaces the field's value in --config (config_from_args)."""
    model = section_models()[section] if section else ExperimentConfig
    for name in fields:
        field = model.model_fields[name]
        doc = " ".join((field.description or "").split()
                       + FLAG_NOTES.get(name, "").split()).replace("%", "%%")
        if field.annotation is bool:
            new = parser.add_argument(flag_for(name), dest=name, help=doc,
                                      action=argparse.BooleanOptionalAction)
        else:
            text = FlagText.of(field.annotation)
            old = tuple(RENAMED_VALUES.get((section, name), ()))
            text = dataclasses.replace(text, old_choices=old) if old else text
            more = f" {_how_many(field)}, separated by spaces or commas." if text.is_list else ""
            new = parser.add_argument(flag_for(name), dest=name, help=doc + more,
                                      action=_FieldFlag, text=text)
        if name in OLD_FLAGS:
            parser.add_argument(OLD_FLAGS[name], dest=name, action=_OldFlag, new=new)
    known = parser.get_default("config_fields") or []
    parser.set_defaults(config_fields=[*known, *((section, name) for name in fields)])


def config_from_args(args, fixed: dict | None = None,
                     flags: list[str] | None = None) -> ExperimentConfig:
    """--config (default: the embedded one) with the values of the config-field flags given,
    and `fixed` ({section: {field: value}}), put in; validated as a config file is, so a bad
    value is refused naming its field (exit 2). `flags`: the command's own flags behind
    `fixed`, named with the others in that message."""
    overrides: dict = {}
    given = list(flags or [])
    for section, name in args.config_fields:
        value = getattr(args, name)
        if value is not None:
            given.append(flag_for(name))
            (overrides.setdefault(section, {}) if section else overrides)[name] = value
    for section, values in (fixed or {}).items():
        overrides.setdefault(section, {}).update(values)
    source = f"given on the command line ({', '.join(given)})" if given else "command line"
    base = load_config(args.config)
    if args.config is None and overrides.get("workload") not in (None, base.workload):
        # The embedded config's name describes its own workload: rows of another one would be
        # recorded under the wrong experiment.
        overrides["name"] = experiment_name_for(overrides["workload"])
    return with_overrides(base, overrides, source)


def experiment_name_for(workload: str) -> str:
    """An experiment name (names.check_name's alphabet) for a run of `workload` on the
    embedded config: 'mytraining:workload' -> 'mytraining-workload'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", workload).strip("-._")
    return re.sub(r"\.\.+", ".", name)[:128] or "workload"


# ------------------------------------------------------------------ output paths
# Longest file name and path the kernel takes (Linux NAME_MAX, PATH_MAX): a longer one fails
# only when the file is written, after the work.
NAME_MAX = 255
PATH_MAX = 4096


def check_output_file(text: str, flag: str) -> Path:
    """A file a command will write (atomically: a temporary file beside it, then a rename),
    checked before any work: not a directory or a device, and its directory exists or can be
    created, and can be written. Nothing is created here."""
    path = _output_path(text, flag)
    with _stat_errors(text, flag):
        _check_file(path, text, flag)
    return path


def _check_file(path: Path, text: str, flag: str) -> None:
    if path.is_dir():
        raise BadInput(f"{flag} {quote(text)} is a directory; give the path of a file")
    if path.exists() and not path.is_file():
        raise BadInput(f"{flag} {quote(text)} is not a regular file (a device, FIFO or socket); "
                       "give the path of a file")
    _check_creatable(path, text, flag)


def check_output_dir(text: str, flag: str) -> Path:
    """A directory a command will write into (created if missing), checked before any work."""
    path = _output_path(text, flag)
    with _stat_errors(text, flag):
        _check_dir(path, text, flag)
    return path


def _check_dir(path: Path, text: str, flag: str) -> None:
    if path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {quote(text)} is a file, not a directory; give a directory "
                       "(it is created if missing)")
    if path.is_dir():
        _check_writable(path, text, flag)
    else:
        _check_creatable(path, text, flag)


@contextlib.contextmanager
def _stat_errors(text: str, flag: str) -> Iterator[None]:
    """A path that cannot even be looked at (a directory we may not search) is refused too."""
    try:
        yield
    except OSError as err:
        raise BadInput(f"{flag} {quote(text)}: cannot check it: {err.strerror}") from None


def _output_path(text: str, flag: str) -> Path:
    if not text or "\0" in text:
        raise BadInput(f"{flag} {quote(text)}: give a path (not empty, no NUL character)")
    path = Path(os.path.abspath(text))
    if len(str(path)) > PATH_MAX or any(len(part.encode()) > NAME_MAX for part in path.parts):
        raise BadInput(f"{flag} {quote(text)} is too long (at most {NAME_MAX} bytes per name, "
                       f"{PATH_MAX} in all)")
    return path


def _check_creatable(path: Path, text: str, flag: str) -> None:
    """The nearest existing directory above `path` is a directory we may write in (so the
    missing ones below it can be created)."""
    ancestor = path.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"{flag} {quote(text)}: {quote(str(ancestor))} is a file, so no "
                       "directory can be created there")
    _check_writable(ancestor, text, flag)


def _check_writable(directory: Path, text: str, flag: str) -> None:
    """Permission bits, then a real probe: an unnamed temporary file (O_TMPFILE, else created
    and removed at once), which also meets what the bits do not say (a read-only mount, /proc,
    quotas). It leaves no entry behind."""
    problem = None if os.access(directory, os.W_OK | os.X_OK) else "no permission"
    if problem is None:
        try:
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as err:
            problem = err.strerror
    if problem:
        raise BadInput(f"{flag} {quote(text)}: cannot write in {quote(str(directory))} "
                       f"({problem})")
