"""batchscale.storage against a real SeaweedFS on loopback, the local atomic writer, and
batchscale.location (one Location type for a directory and an S3 prefix)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.errors import BadInput, ObjectExists, StoreError
from batchscale.location import LocalLocation, S3Location, copy_files, open_file, open_location
from batchscale.storage import (
    ObjectStore,
    S3Settings,
    atomic_file,
    parquet_bytes,
    read_table_file,
    sha256_b64,
    write_bytes_atomic,
    write_table_atomic,
)
from helpers import run_cli, store_env


def _table(n: int = 5) -> pa.Table:
    return pa.table(
        {
            "batch_size": pa.array([2**i for i in range(n)], pa.int64()),
            "samples_per_s": pa.array([100.0 * i + 0.5 for i in range(n)]),
            "status": pa.array(["ok"] * (n - 1) + ["oom"]),
        }
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_table_round_trip(object_store: ObjectStore) -> None:
    key = object_store.key("sweep", "part-0.parquet")
    assert object_store.put_bytes(key, parquet_bytes(_table()))
    assert object_store.get_table(key).equals(_table())
    assert object_store.exists(key)
    assert not object_store.exists(object_store.key("sweep", "other.parquet"))


def test_identical_repeat_write_is_a_no_op(object_store: ObjectStore) -> None:
    key = object_store.key("t.parquet")
    assert object_store.put_bytes(key, parquet_bytes(_table())) is True
    assert object_store.put_bytes(key, parquet_bytes(_table())) is False
    assert object_store.list() == [key]


def test_different_bytes_are_refused_and_original_kept(object_store: ObjectStore) -> None:
    key = object_store.key("blob")
    object_store.put_bytes(key, b"first")
    with pytest.raises(ObjectExists, match=key):
        object_store.put_bytes(key, b"second")
    assert object_store.get_bytes(key) == b"first"


def test_stored_checksum_is_our_sha256(object_store: ObjectStore) -> None:
    key = object_store.key("blob")
    object_store.put_bytes(key, b"payload")
    assert object_store.checksum(key) == sha256_b64(b"payload")


def test_missing_key_names_the_key(object_store: ObjectStore) -> None:
    key = object_store.key("nothing-here")
    with pytest.raises(StoreError, match=f"no object s3://.*/{key}"):
        object_store.get_bytes(key)


def test_corrupt_object_is_bad_input(object_store: ObjectStore) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(_table(), sink)
    truncated = sink.getvalue().to_pybytes()[:-20]
    for name, data in [("garbage", b"not parquet at all"), ("truncated", truncated)]:
        key = object_store.key(name)
        object_store.put_bytes(key, data)
        with pytest.raises(BadInput, match=f"{key} is not a valid Parquet file"):
            object_store.get_table(key)


def test_wrong_credentials_are_refused(object_store: ObjectStore) -> None:
    wrong = dataclasses.replace(object_store.settings, secret_key="not-the-secret-key")
    store = ObjectStore(wrong, max_attempts=1)
    with pytest.raises(StoreError, match="refused the credentials") as info:
        store.check()
    assert store.endpoint in str(info.value)
    assert "not-the-secret-key" not in str(info.value)
    with pytest.raises(StoreError, match="refused the credentials"):
        store.put_bytes(store.key("x"), b"x")


def test_missing_bucket_is_named(object_store: ObjectStore) -> None:
    settings = dataclasses.replace(object_store.settings, bucket="no-such-bucket")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist") as info:
        ObjectStore(settings, max_attempts=1).check()
    assert "not an S3 server" not in str(info.value)  # SeaweedFS marks its 404 as S3's


def test_a_bare_404_says_it_may_not_be_an_s3_server(httpserver) -> None:
    """A web server that answers every request with an empty 404 (no S3 header): the missing
    bucket is one reading, the wrong endpoint the other, and the message gives both."""
    from werkzeug import Response

    bare = Response(status=404)
    del bare.headers["Content-Type"]  # no body, no type: nothing says what answered
    httpserver.expect_request("/batchscale").respond_with_response(bare)
    endpoint = httpserver.url_for("/").rstrip("/")
    store = ObjectStore(S3Settings(endpoint, "batchscale", "p", "id", "secret"), max_attempts=1)
    with pytest.raises(StoreError, match="does not exist at S3 endpoint .*, or it is not an S3 "
                                         r"server: it answered HTTP 404 with no S3 header"):
        store.check()


def test_unreachable_endpoint_fails_fast_naming_it() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    settings = S3Settings(endpoint, "batchscale", "p", "key-id", "sekrit-value")
    store = ObjectStore(settings, max_attempts=2, connect_timeout_s=1, read_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot reach S3 endpoint {endpoint}") as info:
        store.put_bytes(store.key("x"), b"x")
    assert time.monotonic() - started < 10
    assert "sekrit-value" not in str(info.value)


def test_list_follows_pagination(object_store: ObjectStore) -> None:
    keys = [object_store.key("runs", f"r{i}") for i in range(5)]
    for key in keys:
        object_store.put_bytes(key, key.encode())
    object_store.put_bytes(object_store.key("other"), b"o")
    settings = object_store.settings
    raw = boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        region_name="us-east-1",
    )
    first_page = raw.list_objects_v2(Bucket=settings.bucket, Prefix=settings.prefix, MaxKeys=2)
    assert first_page["IsTruncated"], "the server must page, or this test proves nothing"
    assert object_store.list("runs", page_size=2) == keys
    assert len(object_store.list(page_size=2)) == 6


def test_hive_dataset_through_pyarrow_filesystem(object_store: ObjectStore) -> None:
    for run in ("a", "b"):
        key = object_store.key("lake", f"run={run}", "part-0.parquet")
        object_store.put_bytes(key, parquet_bytes(_table(3)))
    path = f"{object_store.settings.bucket}/{object_store.key('lake')}"
    dataset = ds.dataset(path, filesystem=object_store.pyarrow_filesystem(), partitioning="hive")
    table = dataset.to_table()
    assert table.num_rows == 6
    assert sorted(set(table.column("run").to_pylist())) == ["a", "b"]


def test_secrets_stay_out_of_repr_and_messages() -> None:
    settings = S3Settings("http://127.0.0.1:1", "bucket", "p", "AKIDSECRETID", "s3cr3t-value")
    for text in (repr(settings), str(settings), repr(ObjectStore(settings))):
        assert "s3cr3t-value" not in text
        assert "AKIDSECRETID" not in text


def test_settings_from_env() -> None:
    env = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "sekrit-value"}
    settings = S3Settings.from_env(env)
    assert (settings.endpoint_url, settings.bucket, settings.prefix) == (
        None,
        "batchscale",
        "batchscale",
    )
    for missing in env:
        partial = {k: v for k, v in env.items() if k != missing}
        with pytest.raises(StoreError, match=missing) as info:
            S3Settings.from_env(partial)
        assert "sekrit-value" not in str(info.value)
    with pytest.raises(StoreError, match="BATCHSCALE_S3_BUCKET"):
        S3Settings.from_env({**env, "BATCHSCALE_S3_BUCKET": ""})
    with pytest.raises(StoreError, match="BATCHSCALE_S3_ENDPOINT"):
        S3Settings.from_env({**env, "BATCHSCALE_S3_ENDPOINT": "localhost:8333"})


def test_key_joins_prefix_and_parts() -> None:
    store = ObjectStore(S3Settings(None, "bucket", "root/", "id", "secret"))
    assert store.key("a", "/b/", "c.parquet") == "root/a/b/c.parquet"


def test_local_table_written_atomically(tmp_path: Path) -> None:
    path = tmp_path / "out" / "t.parquet"
    write_table_atomic(path, _table())
    write_table_atomic(path, _table(3))
    assert read_table_file(path).equals(_table(3))
    assert [p.name for p in path.parent.iterdir()] == ["t.parquet"]


def test_corrupt_local_file_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    write_table_atomic(path, _table())
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(BadInput, match=f"{path} is not a valid Parquet file"):
        read_table_file(path)
    with pytest.raises(BadInput, match="does not exist"):
        read_table_file(tmp_path / "missing.parquet")


def test_atomic_bytes_get_their_mode_and_a_failed_write_keeps_the_old_file(
        tmp_path: Path) -> None:
    path = tmp_path / "deep" / "secret.json"
    write_bytes_atomic(path, b"old", mode=0o600)
    assert path.read_bytes() == b"old"
    assert path.stat().st_mode & 0o777 == 0o600 & ~_umask()
    with pytest.raises(RuntimeError, match="writer died"), atomic_file(path) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("writer died")
    assert path.read_bytes() == b"old"
    assert [p.name for p in path.parent.iterdir()] == ["secret.json"]


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# ------------------------------------------------------------------------------ locations
def _exercise(location, tmp_path: Path) -> None:
    """The same calls give the same answers on a directory and on an S3 prefix."""
    location.put_bytes("a/x.bin", b"x")
    location.put_table("b.parquet", _table())
    location.put_bytes("a/x.bin", b"x")  # the same bytes again: accepted on both
    assert location.exists("a/x.bin") and not location.exists("a/y.bin")
    assert location.get_bytes("a/x.bin") == b"x"
    assert location.get_table("b.parquet").equals(_table())
    assert location.names() == ["a/x.bin", "b.parquet"]
    assert location.names("a") == ["a/x.bin"]
    assert location.child("a").names() == ["x.bin"]
    assert location.where("a/x.bin") == f"{location.uri}/a/x.bin"
    copy_dir = location.local_dir("a", tmp_path / "cache")
    assert (copy_dir / "a" / "x.bin").read_bytes() == b"x"
    with pytest.raises((BadInput, StoreError), match="b.bin"):
        location.get_bytes("b.bin")
    with pytest.raises(BadInput, match="a/x.bin is not a valid Parquet file"):
        location.get_table("a/x.bin")


def test_local_location(tmp_path: Path) -> None:
    _exercise(open_location(tmp_path / "root"), tmp_path)
    assert open_location(tmp_path / "root").local_dir("a", tmp_path / "c") == tmp_path / "root"


def test_s3_location_by_uri(object_store: ObjectStore, monkeypatch, tmp_path: Path) -> None:
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('loc')}"
    location = open_location(uri)
    assert isinstance(location, S3Location) and location.uri == uri
    _exercise(location, tmp_path)
    with pytest.raises(ObjectExists):
        location.put_bytes("a/x.bin", b"other")  # create-only
    folder, name = open_file(f"{uri}/a/x.bin")
    assert (folder.uri, name) == (f"{uri}/a", "x.bin")
    copied = copy_files(location, LocalLocation(tmp_path / "copy"))
    assert copied == ["a/x.bin", "b.parquet"]
    assert (tmp_path / "copy" / "b.parquet").read_bytes() == location.get_bytes("b.parquet")
    with pytest.raises(BadInput, match="holds no objects"):
        location.local_dir("empty", tmp_path / "cache")


@pytest.mark.parametrize(("uri", "message"), [
    ("s3:///prefix", "must look like s3://bucket/prefix"),
    ("gs://bucket/prefix", "unsupported location"),
])
def test_bad_location_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        open_location(uri)


# ------------------------------------------------- S3 settings and URIs: refused at start-up
PASSWORD = "PASSWORD-never-echoed-31"
KEYS = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "sekrit-value"}
BAD_SETTINGS = [
    ("BATCHSCALE_S3_ENDPOINT", "http://"),
    ("BATCHSCALE_S3_ENDPOINT", "http://127.0.0.1:99999"),
    ("BATCHSCALE_S3_ENDPOINT", "http://[::1"),
    ("BATCHSCALE_S3_ENDPOINT", "http://127.0.0.1:8333/bucket/key"),
    ("BATCHSCALE_S3_ENDPOINT", "http://127.0.0.1:8333?x-id=1"),
    ("BATCHSCALE_S3_ENDPOINT", f"http://admin:{PASSWORD}@127.0.0.1:8333"),
    ("BATCHSCALE_S3_ENDPOINT", "ftp://127.0.0.1"),
    ("BATCHSCALE_S3_BUCKET", "Bad_Bucket!"),
    ("BATCHSCALE_S3_BUCKET", "a/b/../c"),
    ("BATCHSCALE_S3_BUCKET", "b" * 300),
    ("BATCHSCALE_S3_PREFIX", "../x"),
    ("BATCHSCALE_S3_PREFIX", "lake/../../etc"),
    ("BATCHSCALE_S3_PREFIX", "a//b"),
]


@pytest.mark.parametrize(("variable", "value"), BAD_SETTINGS)
def test_bad_s3_settings_are_refused_naming_the_variable(variable, value):
    env = {"BATCHSCALE_S3_ENDPOINT": "http://127.0.0.1:8333", **KEYS, variable: value}
    with pytest.raises(StoreError, match=variable) as err:
        S3Settings.from_env(env)
    assert PASSWORD not in str(err.value) and "sekrit-value" not in str(err.value)


@pytest.mark.parametrize(("variable", "value"), BAD_SETTINGS)
def test_cli_refuses_bad_s3_settings_before_any_work(tmp_path, variable, value):
    env = {"BATCHSCALE_S3_ENDPOINT": "http://127.0.0.1:8333", **KEYS, variable: value}
    result = run_cli(["report", "--run-id", "r1", "--out", "r.html"], cwd=tmp_path, env=env,
                     timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert variable in result.stderr and "Traceback" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert not list(tmp_path.iterdir())


def test_settings_built_in_code_are_checked_too():
    for endpoint, bucket, prefix in [(f"http://u:{PASSWORD}@h:1", "bucket", "p"),
                                     (None, "Bad_Bucket!", "p"), (None, "bucket", "../x")]:
        with pytest.raises(BadInput) as err:
            S3Settings(endpoint, bucket, prefix, "id", "secret")
        assert PASSWORD not in str(err.value)
    assert S3Settings(None, "bucket", "/root/lake/", "id", "secret").prefix == "root/lake"


url_parts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
"""Any text, for host and port; the user part has no whitespace (whitespace ends a URL in a
message, as it does in a shell variable)."""


@settings(max_examples=100, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "s3", "ftp", ""]),
       user=url_parts.filter(lambda u: not any(c.isspace() for c in u)),
       host=st.one_of(st.sampled_from(["127.0.0.1", "[::1]", "[::1", "seaweedfs.kubeflow", ""]),
                      url_parts),
       port=st.one_of(st.none(), st.integers(-5, 70000).map(str), url_parts),
       rest=st.sampled_from(["", "/", "/p", "?q=1", "#f", "/../x"]))
def test_any_endpoint_is_accepted_cleanly_or_refused_without_echoing_a_password(
        scheme, user, host, port, rest):
    auth = f"{user}:{PASSWORD}@" if user else ""
    url = f"{scheme}://{auth}{host}{f':{port}' if port is not None else ''}{rest}"
    try:
        settings_ = S3Settings.from_env({"BATCHSCALE_S3_ENDPOINT": url, **KEYS})
    except StoreError as err:
        assert PASSWORD not in str(err)
        return
    parts = urlsplit_strict(settings_.endpoint_url)
    assert parts.scheme in ("http", "https") and parts.hostname and "@" not in parts.netloc
    assert not parts.path.strip("/") and not parts.query and not parts.fragment


@pytest.mark.parametrize("endpoint", [
    *(f"http://admin:p{c}{PASSWORD}@h:8333" for c in "?#:@/"),  # delimiters typed unencoded
    f"admin:{PASSWORD}@localhost:8333", f"://admin:{PASSWORD}@h:8333"])  # no scheme
def test_a_password_in_a_malformed_endpoint_is_not_echoed_either(endpoint):
    with pytest.raises(StoreError) as err:
        S3Settings.from_env({"BATCHSCALE_S3_ENDPOINT": endpoint, **KEYS})
    assert PASSWORD not in str(err.value)


def urlsplit_strict(url: str):
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    assert parts.port is None or 0 <= parts.port < 65536
    return parts


@pytest.mark.parametrize(("uri", "message"), [
    (f"s3://KEY:{PASSWORD}@bucket/x", "carries credentials"),
    ("s3://Bad_Bucket!/x", "not a valid S3 bucket name"),
    ("s3://" + "b" * 300 + "/x", "not a valid S3 bucket name"),
    ("s3://bucket/a/../../x", "not allowed"),
    ("s3://bucket/x?versionId=1", "query or fragment"),
    ("http://[::1", "neither a local path nor an s3:// URI"),
    (f"gs://KEY:{PASSWORD}@bucket/x", "unsupported location"),
])
def test_bad_s3_uris_are_refused_without_echoing_credentials(uri, message):
    for opener in (open_location, open_file) if uri.startswith("s3://") else (open_location,):
        with pytest.raises(BadInput, match=message) as err:
            opener(uri)
        assert PASSWORD not in str(err.value)
