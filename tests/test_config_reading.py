"""Reading a config file with bounds: its kind, size, encoding, repeated keys, aliases and
depth are checked before it is parsed, and each refusal names the problem."""

import os
import threading
import time
from pathlib import Path

import pytest

from batchscale.config import (
    MAX_CONFIG_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    ExperimentConfig,
    load_config,
    parse_config,
)
from batchscale.errors import BadInput

# ------------------------------------------------------------ reading a config file, bounded
# (seen: an alias bomb and a FIFO hung `compile`, a 10 MB config took a minute, repeated
# keys silently kept the last, a non-UTF-8 file gave a traceback.)
ALIAS_BOMB = ('a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
              + "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
                        for p, c in zip("abcdefgh", "bcdefghi", strict=True)))


def refused(tmp_path, text: str | bytes, *needles: str) -> str:
    path = tmp_path / "c.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    with pytest.raises(BadInput) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message
    return message


def test_alias_bomb_is_refused_at_once(tmp_path):
    start = time.monotonic()
    refused(tmp_path, ALIAS_BOMB, f"expands to more than {MAX_YAML_NODES} YAML nodes")
    refused(tmp_path, ALIAS_BOMB.replace("i: &i", "name: &i"), "through its aliases")
    assert time.monotonic() - start < 2


def test_aliases_and_merge_keys_within_the_bound_still_work(tmp_path):
    plain = {"kubernetes": {
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "gpu_tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "node_selector": {"pool": "a", "zone": "z1"}, "gpu_node_selector": {"pool": "b",
                                                                          "zone": "z1"}}}
    (tmp_path / "c.yaml").write_text(
        "kubernetes:\n"
        "  tolerations: &t [{key: gpu, operator: Exists, effect: NoSchedule}]\n"
        "  gpu_tolerations: *t\n"
        "  node_selector: &n {pool: a, zone: z1}\n"
        "  gpu_node_selector: {<<: *n, pool: b}\n")  # an explicit key overrides a merged one
    assert load_config(tmp_path / "c.yaml") == parse_config(plain)


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("sweep:\n  device: cpu\nname: x\nsweep:\n  device: cuda\n", "'sweep'", "line 1 and line 4"),
    ("sweep:\n  device: cpu\n  precision: fp32\n  device: cuda\n", "'device'",
     "line 2 and line 4"),
    ("sweep: {device: cpu, device: cpu}\n", "'device'", "line 1 and line 1"),
    ("kubernetes:\n  tolerations:\n    - key: a\n      key: b\n", "'key'", "line 3 and line 4"),
    ("kubernetes:\n  node_selector: {1: a, 1.0: b}\n", "1.0", "line 2 and line 2"),
    ("x: &m {a: 1, a: 2}\n", "'a'", "line 1"),
    ("sweep: {<<: {device: cpu, device: cuda}}\n", "'device'", "line 1"),
])
def test_repeated_keys_are_refused_at_any_level(tmp_path, text, key, lines):
    refused(tmp_path, text, f"repeats the key {key} in one mapping", lines, "appear once")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = {"fifo": tmp_path / "pipe", "directory": tmp_path, "device": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    outcome = {}

    def load():
        try:
            load_config(path)
        except BadInput as err:
            outcome["message"] = str(err)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # release the reader so the test ends (opening for write unblocks it)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), f"loading a {kind} blocked"
    assert "not a regular file; give a YAML file" in outcome["message"]


def test_oversized_configs_are_refused_by_their_size(tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as file:  # sparse: the size alone refuses it, nothing is read
        file.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(BadInput, match=rf"is {MAX_CONFIG_BYTES + 1} bytes; a config may be at "
                                       rf"most {MAX_CONFIG_BYTES} bytes \(1 MiB\)"):
        load_config(big)
    start = time.monotonic()  # just under the size: the node bound stops parsing early
    many = "kubernetes:\n  node_selector:\n" + "".join(f"    k{i}: v\n" for i in range(75_000))
    assert len(many) < MAX_CONFIG_BYTES
    refused(tmp_path, many, f"has more than {MAX_YAML_NODES} YAML nodes")
    assert time.monotonic() - start < 3


@pytest.mark.parametrize(("text", "needles"), [
    ("name: caf\xe9\n".encode("latin-1"),
     ("is not UTF-8 text: byte 0xe9 at line 1 (offset 9)", "save it as UTF-8")),
    (b"\xff\xfen\x00a\x00", ("is not UTF-8 text: byte 0xff",)),
    ("name: " + "[" * 5000 + "]" * 5000 + "\n", (f"more than {MAX_YAML_DEPTH} deep",)),
    ("name: &a [*a]\n", ("an alias refers to a node that contains it",)),
    ("convergence:\n  seeds: [" + "9" * 5000 + "]\n",
     ("line 2: cannot read the value: an integer of more than 4300 digits",)),
    ("name: 2024-13-45\n", ("line 1: cannot read the value: month must be in 1..12",)),
    ("sweep: [unclosed\n", ("is not valid YAML",)),
])
def test_malformed_yaml_is_named(tmp_path, text, needles):
    refused(tmp_path, text, *needles)


def test_a_bom_and_an_empty_file_load_as_before(tmp_path):
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbfname: x\n")
    assert load_config(tmp_path / "bom.yaml").name == "x"
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml") == ExperimentConfig()
