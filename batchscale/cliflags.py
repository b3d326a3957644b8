"""Command-line flags generated from the config models: one flag per config field, named after
it (`time_budget_s` -> `--time-budget-s`), with the field's docstring as help. A flag that is
given replaces the field's value in --config, and the result is validated like a config file,
so a bad value is refused naming its field (exit 2)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from batchscale.config import ExperimentConfig, load_config, section_models, with_overrides

# Spellings that flags had before they were named after their config field: still accepted,
# with a note on stderr, until the next release.
OLD_FLAGS = {"torch_compile": "--compile", "image_size_px": "--image-size",
             "memory_limit_bytes": "--memory-limit", "time_budget_s": "--time-budget",
             "lr_rules": "--lr-rule"}


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
        items = [piece for token in text for piece in token.split(",") if piece.strip()]
        if len(items) == 1 and items[0] in self.words:
            return items[0]
        return [self._one(piece) for piece in items]

    def _one(self, text: str):
        if self.choices and text not in self.choices:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(self.choices)})")
        try:
            return self.item(text)
        except ValueError:
            kind = "an integer" if self.item is int else "a number"
            raise ValueError(f"{text!r} is not {kind}") from None


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
        super().__init__(option_strings, dest, nargs=0 if new.nargs == 0 else None,
                         help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        flag = self.new.option_strings[0]
        print(f"batchscale: {option_string} is deprecated and goes in the next release; use "
              f"{flag}", file=sys.stderr)
        self.new(parser, namespace, [values] if self.new.nargs == "+" else values, flag)


def add_config_flags(parser: argparse.ArgumentParser, section: str | None,
                     fields: list[str]) -> None:
    """A flag per config field of `section` (None: the top level), named after it, with the
    field's docstring as help: bools as --x/--no-x, lists separated by spaces or commas. A flag
    that is given replaces the field's value in --config (config_from_args)."""
    model = section_models()[section] if section else ExperimentConfig
    for name in fields:
        field = model.model_fields[name]
        doc = " ".join((field.description or "").split()).replace("%", "%%")
        if field.annotation is bool:
            new = parser.add_argument(flag_for(name), dest=name, help=doc,
                                      action=argparse.BooleanOptionalAction)
        else:
            text = FlagText.of(field.annotation)
            more = " One or more, separated by spaces or commas." if text.is_list else ""
            new = parser.add_argument(flag_for(name), dest=name, help=doc + more,
                                      action=_FieldFlag, text=text)
        if name in OLD_FLAGS:
            parser.add_argument(OLD_FLAGS[name], dest=name, action=_OldFlag, new=new)
    known = parser.get_default("config_fields") or []
    parser.set_defaults(config_fields=[*known, *((section, name) for name in fields)])


def config_from_args(args, fixed: dict | None = None) -> ExperimentConfig:
    """--config (default: the embedded one) with the values of the config-field flags given,
    and `fixed` ({section: {field: value}}), put in; validated as a config file is, so a bad
    value is refused naming its field (exit 2)."""
    overrides: dict = {}
    given = []
    for section, name in args.config_fields:
        value = getattr(args, name)
        if value is not None:
            given.append(flag_for(name))
            (overrides.setdefault(section, {}) if section else overrides)[name] = value
    for section, values in (fixed or {}).items():
        overrides.setdefault(section, {}).update(values)
    source = f"given on the command line ({', '.join(given)})" if given else "command line"
    return with_overrides(load_config(args.config), overrides, source)
