"""Reading a config: YAML files read within bounds (regular files only, size, nesting, alias
expansion, repeated keys, UTF-8), parsed into the models, and refusals described one line per
field with bounded, redacted quotes of what was given.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from batchscale import names
from batchscale.config.models import (
    DEFAULT_CONFIG_PATH,
    ExperimentConfig,
    quote_value,
    section_models,
)
from batchscale.errors import BadInput
from batchscale.schemas import OLD_LR_RULES

_UNION_TAG = re.compile(r"[a-z_-]+\[.*\]")  # pydantic's union-branch labels, e.g. literal['auto']
MESSAGE_CHARS = 400
"""Most characters of one problem's description (a check may quote the value itself); a longer
one keeps its start and its end (which says what is allowed)."""
FIELD_CHARS = 64
"""Most characters of one part of a field's name (a key of the config's own mappings)."""
MAX_REPORTED_FIELDS = 20
"""Most bad fields listed in one message; the rest are counted."""


def _bounded(text: str, limit: int, keep_end: bool = False) -> str:
    """`text` with credentials in URLs redacted, in at most `limit` characters: cut at its end,
    or with `keep_end` in its middle."""
    text = names.redact_url(text)
    if len(text) <= limit:
        return text
    if keep_end:
        half = (limit - 3) // 2
        return f"{text[:half]} … {text[-half:]}"
    return text[:limit - 1] + "…"


def describe_invalid(err: ValidationError, source: str) -> str:
    """One line per bad field, `section.field: problem (got value)`, at most
    MAX_REPORTED_FIELDS of them. Union branches (a batch list or 'auto') are folded into their
    field, the most specific error winning. Values and problems are quoted bounded and with
    credentials redacted."""
    entries: dict[str, list[str]] = {}
    for e in err.errors(include_url=False):
        loc = [_bounded(str(p), FIELD_CHARS) for p in e["loc"]
               if not _UNION_TAG.fullmatch(str(p))]
        field = ".".join(loc) or "(top level)"
        msg = _bounded(e["msg"].removeprefix("Value error, "), MESSAGE_CHARS, keep_end=True)
        # Model-level checks say "field: problem"; report them as section.field like the rest.
        named = re.match(r"^([a-z_]+): (.*)", msg, re.S)
        if named and e["loc"]:
            field, msg = f"{field}.{named[1]}", named[2]
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _nearest_key(e["loc"])
        # A model-level check's input is a whole section (or config): its message says what
        # was wrong, and the section's dump would bury it.
        whole = isinstance(e.get("input"), dict) and e["type"] == "value_error"
        got = quote_value(e.get("input"))
        entries.setdefault(field, []).append(msg if whole or got in msg else f"{msg} (got {got})")
    parents = {f[:i] for f in entries for i, c in enumerate(f) if c == "."}
    fields = [f for f in entries if f not in parents]
    lines = [f"  {f}: {' or '.join(entries[f])}" for f in fields[:MAX_REPORTED_FIELDS]]
    if len(fields) > MAX_REPORTED_FIELDS:
        lines.append(f"  ... and {len(fields) - MAX_REPORTED_FIELDS} more fields")
    return "\n".join([f"invalid config {source}:", *lines])


def _nearest_key(loc: tuple) -> str:
    """'; did you mean "x"?' for an unknown key close to a key of its section, else ""."""
    model = ExperimentConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


RENAMED_KEYS = {("sweep", "warmup_steps"): "untimed_steps",
                ("convergence", "lr_grid"): "lr_candidates"}
"""(section, old key) -> new key: names that meant two things, still read, with a note on
stderr, until the next release."""
RENAMED_VALUES = {("convergence", "lr_rules"): OLD_LR_RULES}
"""(section, list key) -> {old value: new value}: values renamed for the same reason."""


def _renamed(data: dict, source: str) -> dict:
    """`data` with each old key of RENAMED_KEYS under its new name (refused when both are set)."""
    for (section, old), new in RENAMED_KEYS.items():
        values = data.get(section)
        if not isinstance(values, dict) or old not in values:
            continue
        if new in values:
            raise BadInput(f"invalid config {source}: {section}.{old} and {section}.{new} are "
                           f"both set; {old} is the old name of {new}: keep only {new}")
        print(f"batchscale: note: config {source}: {section}.{old} is now {section}.{new}; "
              f"the old name is read until the next release", file=sys.stderr)
        kept = {key: value for key, value in values.items() if key != old}
        data = {**data, section: {**kept, new: values[old]}}
    return _renamed_values(data, source)


def _renamed_values(data: dict, source: str) -> dict:
    for (section, key), renames in RENAMED_VALUES.items():
        values = data.get(section)
        items = values.get(key) if isinstance(values, dict) else None
        old = [v for v in items if isinstance(v, str) and v in renames] \
            if isinstance(items, list) else []
        if not old:
            continue
        for name in dict.fromkeys(old):
            print(f"batchscale: note: config {source}: {section}.{key}: {name!r} is now "
                  f"{renames[name]!r}; the old name is read until the next release",
                  file=sys.stderr)
        data = {**data, section: {**values, key: [renames.get(v, v) if isinstance(v, str) else v
                                                  for v in items]}}
    return data


def parse_config(data: object, source: str = "<dict>") -> ExperimentConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"invalid config {source}: expected a mapping at top level")
    data = _renamed(data, source)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise BadInput(describe_invalid(err, source)) from None


def load_config(path: str | Path | None = None) -> ExperimentConfig:
    path = Path(path) if path else DEFAULT_CONFIG_PATH
    data = read_yaml_config(path)
    if data is None or data == {}:  # accepted: every setting has a default; said, not silent
        print(f"batchscale: note: config {path} sets nothing (empty, or only comments): "
              "every setting is its default", file=sys.stderr)
    return parse_config(data, str(path))


def config_from_json(text: str) -> ExperimentConfig:
    return parse_config(json.loads(text), "<pipeline parameter>")


def with_overrides(cfg: ExperimentConfig, overrides: dict, source: str) -> ExperimentConfig:
    """`cfg` with some values replaced, validated as a config file is (errors name the field).
    `overrides` maps a top-level key to its value, or a section to {field: value}."""
    if not overrides:
        return cfg
    data = cfg.model_dump(mode="json")
    sections = section_models()
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if key in sections else value
    return parse_config(data, source)



# ------------------------------------------------------------------ reading a config file
MAX_CONFIG_BYTES = 2**20
"""Largest config file read, 1 MiB: a config is a few KB, and PyYAML's pure-Python parser takes
seconds per MB."""
MAX_YAML_NODES = 10_000
"""Most YAML nodes (keys, values, list items) a config may expand to, each use of an alias
counted at the size of what it points to: nested anchors (an "alias bomb") make a few hundred
bytes stand for billions of values. Aliases themselves stay allowed (existing configs may share
a toleration list that way); a real config has a few hundred nodes."""
MAX_YAML_DEPTH = 32
"""Deepest nesting of lists and mappings (the config's own is 3)."""
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A config file's shape that is refused; the message continues 'config PATH …'."""


def read_yaml_config(path: Path) -> object:
    """The YAML document in `path`, read with bounds: a regular file (a FIFO or device would
    block or never end), at most MAX_CONFIG_BYTES, UTF-8, no key repeated in a mapping, at
    most MAX_YAML_NODES nodes with aliases expanded, nested at most MAX_YAML_DEPTH deep.
    Anything else raises BadInput naming the file and the limit."""
    try:
        text = _read_text(path)
        return _parse_yaml(text)
    except _Refused as err:
        raise BadInput(f"config {path} {err}") from None
    except yaml.YAMLError as err:
        problem = _bounded(str(err), 2 * MESSAGE_CHARS, keep_end=True)  # with a line's snippet
        raise BadInput(f"config {path} is not valid YAML: {problem}") from None


def _read_text(path: Path) -> str:
    try:
        _refuse_irregular(os.stat(path))
        # O_NONBLOCK: should the path have become a FIFO since the stat, opening it still
        # returns at once, and the fstat below refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            _refuse_irregular(os.fstat(file.fileno()))
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise BadInput(f"cannot read config {path}: {err.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _Refused(f"is larger than {MAX_CONFIG_BYTES} bytes (1 MiB), the most a config "
                       "may be; a config is a few KB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise _Refused(f"is not UTF-8 text: byte 0x{data[err.start]:02x} at line {line} "
                       f"(offset {err.start}); save it as UTF-8") from None


def _refuse_irregular(info: os.stat_result) -> None:
    for is_kind, kind in _FILE_KINDS:
        if is_kind(info.st_mode):
            raise _Refused(f"is {kind}, not a regular file; give a YAML file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _Refused(f"is {info.st_size} bytes; a config may be at most {MAX_CONFIG_BYTES} "
                       "bytes (1 MiB), and is a few KB")


def _parse_yaml(text: str) -> object:
    loader = _ConfigLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _refuse_expansion(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that stops composing past MAX_YAML_NODES nodes or MAX_YAML_DEPTH
    levels (before the whole file is parsed), refuses a key repeated in one mapping (YAML would
    keep the last silently, even of a whole section) and names the line of a value it cannot
    build (a date like 2024-13-45, an integer of over 4,300 digits)."""

    def __init__(self, text: str):
        super().__init__(text)
        self._composed = 0
        self._depth = 0
        self._key_checked: set[int] = set()

    def compose_node(self, parent, index):
        self._composed += 1
        if self._composed > MAX_YAML_NODES:
            raise _Refused(f"has more than {MAX_YAML_NODES} YAML nodes (keys, values, list "
                           "items); a config has a few hundred")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(f"nests lists or mappings more than {MAX_YAML_DEPTH} deep "
                               f"(line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except ValueError as err:
            problem = ("an integer of more than 4300 digits" if "integer string conversion"
                       in str(err) else _bounded(str(err), MESSAGE_CHARS))
            raise _Refused(f"line {node.start_mark.line + 1}: cannot read the value: "
                           f"{problem}") from None

    def flatten_mapping(self, node):
        # Checked once per mapping, before merge keys ('<<') add their keys to it: an explicit
        # key overriding a merged one is YAML's documented way to override, not a repeat.
        if id(node) not in self._key_checked:
            self._key_checked.add(id(node))
            self._refuse_repeated_keys(node)
        super().flatten_mapping(node)

    def _refuse_repeated_keys(self, node: yaml.MappingNode) -> None:
        first_line: dict[object, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue  # a list or mapping as a key is refused by PyYAML itself
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in first_line:
                raise _Refused(f"repeats the key {quote_value(key)} in one mapping (line "
                               f"{first_line[key]} and line {line}); each key may appear once "
                               "(YAML would silently keep the last)")
            first_line[key] = line


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


def _refuse_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand past MAX_YAML_NODES nodes or MAX_YAML_DEPTH
    levels, or refer to a node that contains them (a cycle). Each distinct node is visited once
    (sizes are memoized), so this takes time linear in the file, whatever it expands to."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_nodes.discard(key)
            if size[key] > MAX_YAML_NODES:
                raise _Refused(f"expands to more than {MAX_YAML_NODES} YAML nodes through its "
                               "aliases (anchors used inside one another); a config has a few "
                               "hundred")
            if depth[key] > MAX_YAML_DEPTH:
                raise _Refused(f"nests lists or mappings more than {MAX_YAML_DEPTH} deep "
                               "through its aliases")
        elif key in open_nodes:
            raise _Refused(f"line {node.start_mark.line + 1}: an alias refers to a node that "
                           "contains it (a recursive structure)")
        elif key not in size:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((kid, False) for kid in _children(node))
