"""The local store's state files corrupted every way (batchscale/localstore/state.py): a clear
refusal that names the file and the way to recover, nothing written, no weed started; and the
recovery the message gives works and keeps the data."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscale import cli, localstore
from batchscale.errors import StoreError
from batchscale.localstore import state as state_files
from batchscale.storage import ObjectStore
from helpers import run_cli

# --- corrupt state files: a clear refusal that says how to recover, nothing written --------


def _state_template(root: Path) -> Path:
    """A workdir whose store was set up once (keys, ports, lock) and is not running."""
    work = root / "work"
    state = localstore.state_dir(work)
    state.mkdir(parents=True, mode=0o700)
    state_files.credentials(state)
    state_files.record(state, "batchscale", dict(localstore.DEFAULT_PORTS))
    (state / "lock").touch()
    return work


def _snapshot(state: Path) -> dict:
    return {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in sorted(state.rglob("*"))}


def _weed_serves(state: Path) -> bool:
    """Whether any process is a weed for this state's data dir."""
    flag = os.fsencode(f"-dir={state / 'data'}")
    for proc in Path("/proc").iterdir():
        try:
            if flag in (proc / "cmdline").read_bytes().split(b"\0"):
                return True
        except OSError:
            continue
    return False


VALID_PORTS = dict(localstore.DEFAULT_PORTS)
CORRUPTIONS = {
    "credentials.json": [
        b"{not json", b"", b'{"access_key": "bs0123', b"[]", b"\xff\xfe\x00",
        json.dumps({"access_key": "PLANTED-SECRET", "secret_key": 5}).encode(),
        json.dumps({"access_key": "a key with spaces", "secret_key": "x"}).encode(),
        json.dumps({"secret_key": "PLANTED-SECRET"}).encode(), b"[" * 100_000,
        b" " * 70_000 + b"{}", "directory", "fifo",
    ],
    "ports.json": [
        b"{not json", b'{"bucket": "batchscale", "po', b"null",
        json.dumps({"bucket": "batchscale", "ports": [8333]}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": "8333"}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": True}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": 65000}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {"s3": 8333}}).encode(),
        json.dumps({"bucket": "Bad_Bucket!", "ports": VALID_PORTS}).encode(),
        json.dumps({"ports": VALID_PORTS}).encode(), "directory", "fifo",
    ],
    "weed.pid": ["directory", "fifo"],
    "weed.log": ["directory"],
    "data": ["file"],
    "weed-config": ["file"],
}
CASES = [(name, bad) for name, bads in CORRUPTIONS.items() for bad in bads]


def _corrupt(path: Path, bad: bytes | str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.unlink(missing_ok=True)
    if bad == "directory":
        path.mkdir()
    elif bad == "fifo":
        os.mkfifo(path)
    elif bad == "file":
        path.write_bytes(b"")
    else:
        path.write_bytes(bad)


@pytest.mark.parametrize(("name", "bad"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_a_corrupt_state_file_is_refused_with_the_way_to_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, name: str,
    bad: bytes | str,
) -> None:
    """Every corruption through the CLI's own entry point (in this process, for speed; the test
    below runs the real command for a few of them)."""
    work = _state_template(tmp_path)
    state = localstore.state_dir(work)
    _corrupt(state / name, bad)
    before = _snapshot(state)
    monkeypatch.chdir(work)
    for action in ("up", "status", "env"):
        assert cli.main(["store", action]) == 2, action
        out, err = capsys.readouterr()
        assert out == "" and str(state / name) in err and "batchscale store up" in err
        assert "PLANTED-SECRET" not in err
    assert _snapshot(state) == before
    assert not _weed_serves(state)


@pytest.mark.parametrize(("name", "bad"), [
    ("credentials.json", b"{not json"), ("ports.json", CORRUPTIONS["ports.json"][4]),
    ("weed.pid", "fifo"),
])
def test_the_command_refuses_a_corrupt_state_file_without_a_traceback(
    tmp_path: Path, name: str, bad: bytes | str
) -> None:
    work = _state_template(tmp_path)
    state = localstore.state_dir(work)
    _corrupt(state / name, bad)
    before = _snapshot(state)
    for action in ("up", "status", "env"):
        result = run_cli(["store", action], cwd=work, timeout_s=60)
        assert result.returncode == 2, (action, result.stdout, result.stderr)
        assert str(state / name) in result.stderr and "batchscale store up" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert _snapshot(state) == before
    assert not _weed_serves(state)


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    state = localstore.state_dir(tmp_path)
    state.parent.mkdir(parents=True)
    state.write_text("not a directory")
    for action in ("up", "status", "env"):
        result = run_cli(["store", action], cwd=tmp_path, timeout_s=60)
        assert result.returncode == 2 and str(state) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert state.read_text() == "not a directory"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
STATE_CONTENTS = st.one_of(
    st.binary(max_size=64),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"access_key": JSON_VALUES, "secret_key": JSON_VALUES}).map(
        lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({
        "bucket": st.sampled_from(["batchscale", "x", ""]) | JSON_VALUES,
        "ports": st.dictionaries(st.sampled_from([*VALID_PORTS, "x"]),
                                 st.integers(-1, 70_000) | JSON_VALUES),
    }).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["credentials.json", "ports.json"]), content=STATE_CONTENTS)
def test_any_state_file_content_is_used_or_refused_clearly(
    tmp_path: Path, name: str, content: bytes
) -> None:
    state = localstore.state_dir(tmp_path)
    state.mkdir(parents=True, exist_ok=True)
    for stale in state.iterdir():
        stale.unlink()
    (state / name).write_bytes(content)
    try:
        assert localstore.status(tmp_path) is None  # valid, and nothing runs
    except StoreError as exc:
        assert str(state / name) in str(exc) and "batchscale store up" in str(exc)


def test_the_recovery_the_message_gives_works_and_keeps_the_data(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    info = localstore.up(work)
    try:
        key, content = "kept/object.bin", secrets.token_bytes(64)
        ObjectStore(info.settings(prefix="")).put_bytes(key, content)
        state = localstore.state_dir(work)
        for name in ("credentials.json", "ports.json"):
            (state / name).write_bytes(b"{truncated")
            refused = run_cli(["store", "up"], cwd=work, timeout_s=120)
            assert refused.returncode == 2 and "Remove it and run" in refused.stderr
            (state / name).unlink()  # what the message says to do
            assert run_cli(["store", "up"], cwd=work, timeout_s=120).returncode == 0
            info = localstore.status(work)
            assert info is not None
            assert ObjectStore(info.settings(prefix="")).get_bytes(key) == content
    finally:
        localstore.down(work)
