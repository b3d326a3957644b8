"""batchscale/names.py, the one place that checks user-supplied names and URLs: run ids and
names are one safe path segment, workload names a registered name or 'package.module:factory',
prefixes safe '/'-separated parts; redact_url hides the credentials of every URL in a text
(linear time), and no message of a check echoes a password."""

from __future__ import annotations

import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale import names
from batchscale.errors import BadInput

SAFE_FIRST = string.ascii_letters + string.digits
SAFE_REST = SAFE_FIRST + "_.-"
safe_names = st.builds(lambda first, rest: first + rest, st.sampled_from(SAFE_FIRST),
                       st.text(SAFE_REST, max_size=127)).filter(lambda s: ".." not in s)
# Pieces that make any name unsafe wherever they stand: a separator, '..', a control character,
# a look-alike dot, a character outside ASCII.
# (':' is unsafe in a run id too, but makes 'a:b' a factory spec: test_colons_... covers it.)
BAD_PIECES = ["/", "..", "\\", "\n", "\0", "\r", "\t", " ", "\u2024", "\uff0e", "\u3002",
              "\u0665", "é", "%2e%2e/", "~", "$", "*"]
bad_pieces = st.sampled_from(BAD_PIECES)
unsafe_names = st.one_of(
    st.builds(lambda a, bad, b: a + bad + b, st.text(SAFE_REST, max_size=8), bad_pieces,
              st.text(SAFE_REST, max_size=8)),
    st.builds(lambda lead, rest: lead + rest, st.sampled_from([".", "-", "_"]),
              st.text(SAFE_REST, max_size=8)),
    st.text(SAFE_REST, min_size=129, max_size=300).map(lambda s: "a" + s),
    st.sampled_from(["", ".", "..", "../x", "/abs", "a/../../b", "x\n", "x\0", "..\\x",
                     "C:\\x", "\u2024\u2024/x", "\uff0e\uff0e", "a" * 129]),
)
SECRET = "Pw9zQ7xK"


@given(safe_names)
@settings(max_examples=100, deadline=None)
def test_safe_names_pass_every_name_check_unchanged(name):
    assert names.check_run_id(name) == name
    assert names.check_name(name, "experiment name") == name
    assert names.check_workload(name) == name
    assert names.check_prefix(name) == name


@given(unsafe_names)
@settings(max_examples=100, deadline=None)
def test_traversal_and_odd_names_are_refused_naming_the_input(name):
    for check, what in ((names.check_run_id, "run id"),
                        (lambda v: names.check_name(v, "experiment name"), "experiment name"),
                        (lambda v: names.check_workload(v, "--workload"), "--workload")):
        with pytest.raises(BadInput, match=what) as err:
            check(name)
        assert len(str(err.value)) < 400  # a 300-character name is quoted short


def test_a_trailing_newline_is_no_longer_accepted():
    # `$` matched before a final newline: '../x' was refused but 'run1\n' was not.
    for check in (names.check_run_id, names.check_name):
        with pytest.raises(BadInput):
            check("run1\n")
    assert names.check_run_id("20261129T000000Z-abc123") == "20261129T000000Z-abc123"


def test_colons_are_refused_in_run_ids_and_names():
    for check in (names.check_run_id, names.check_name):
        with pytest.raises(BadInput):
            check("a:b")


def test_non_text_is_refused():
    for value in (None, 3, b"run", ["a"]):
        with pytest.raises(BadInput):
            names.check_run_id(value)


@pytest.mark.parametrize("prefix", ["a/../b", "../x", "a//b", "a/./b", "a/b\n", "a/\u2024/b",
                                    "a\\b", "a/.hidden"])
def test_prefixes_with_empty_dot_or_odd_parts_are_refused(prefix):
    with pytest.raises(BadInput, match="S3 prefix"):
        names.check_prefix(prefix)


def test_prefixes_lose_their_outer_slashes():
    assert names.check_prefix("/team/batchscale/") == "team/batchscale"
    assert names.check_prefix("") == ""


# ------------------------------------------------------------------------- workload names
@pytest.mark.parametrize("spec", ["pkg.models:build", "m:f", "_private.mod:_make",
                                  "a.b.c.d:Model"])
def test_factory_specs_are_split(spec):
    assert names.is_factory_spec(spec)
    assert names.split_factory_spec(spec) == tuple(spec.split(":"))


@pytest.mark.parametrize("spec", ["pkg.models:build\n", "../x:y", "a..b:c", "a/b:c", "a:b:c",
                                  "a:", ":b", "1a:b", "a:b.c", "mod\u0665:f", "modé:f",
                                  "a" * 300 + ":f", "a :b"])
def test_malformed_factory_specs_are_refused(spec):
    assert not names.is_factory_spec(spec)
    with pytest.raises(BadInput, match="package.module:factory"):
        names.split_factory_spec(spec)


# --------------------------------------------------------------------------------- URLs
@pytest.mark.parametrize("text", [
    f"http://admin:{SECRET}@h:8333", f"http://admin:p@{SECRET}@h:8333",
    f"http://admin:p/{SECRET}@h:8333", f"admin:{SECRET}@localhost:8333",
    f"://admin:{SECRET}@h:8333", f"endpoint 'http://u:{SECRET}@h:1' refused",
    f'"http://u:{SECRET}\'"@h"', f"(s3://KEY:{SECRET}@bucket/x)", f"x=u:{SECRET}@h",
    f"HTTPS://u:{SECRET}@h and http://v:{SECRET}@g", f"s3://KEY:{SECRET}@b/k?x=1",
])
def test_credentials_are_redacted_in_any_url_form(text):
    redacted = names.redact_url(text)
    assert SECRET not in redacted
    assert names.REDACTED in redacted


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:8333", "https://s3.example.com/bucket/key", "mail maintainers@example.org",
    "no url here", "run id 'a/b' is not allowed", "s3://bucket/prefix/x.parquet", "",
])
def test_text_without_credentials_is_left_alone(text):
    assert names.redact_url(text) == text


password_chars = st.text(st.characters(codec="ascii", exclude_characters=" \t\n\r"),
                         max_size=12)
context = st.text(st.characters(codec="ascii", exclude_characters="@"), max_size=20)


@given(st.sampled_from(["http://", "https://", "s3://", "://", ""]), password_chars,
       password_chars, context, context)
@settings(max_examples=100, deadline=None)
def test_a_password_is_never_left_in_a_redacted_text(scheme, before, after, left, right):
    # Any user and password without whitespace, '@' and '/' included, in any surrounding text.
    url = f"{scheme}user:{before}{SECRET}{after}@host:8333/x"
    assert SECRET not in names.redact_url(f"{left} {url} {right}")


def test_redaction_is_linear_in_the_text():
    started = time.monotonic()
    for text in ("a" * 2_000_000, "://" * 500_000, "a:b@" * 400_000, "http://x " * 200_000):
        names.redact_url(text)
    assert time.monotonic() - started < 5


@given(st.sampled_from(["http", "https", "s3", "", "ftp"]), password_chars, context)
@settings(max_examples=100, deadline=None)
def test_no_url_check_echoes_a_password(scheme, tail, host):
    url = f"{scheme}://user:{SECRET}{tail}@{host}"
    for check in (names.check_endpoint, names.split_s3_uri):
        with pytest.raises(BadInput) as err:
            check(url)
        assert SECRET not in str(err.value)


@pytest.mark.parametrize("url", ["http://", "http://127.0.0.1:99999", "http://[::1",
                                 "http://h:8333/path", "http://h:8333?q=1", "ftp://h"])
def test_bad_endpoints_are_refused(url):
    with pytest.raises(BadInput, match="S3 endpoint"):
        names.check_endpoint(url)


def test_quote_is_short_and_redacted():
    assert len(names.quote("x" * 10_000)) == names.QUOTE_CHARS
    assert SECRET not in names.quote(f"http://u:{SECRET}@h")
    assert names.quote("run\n") == "'run\\n'"
