"""Property-based tests (hypothesis) over the config schema and the CLI arguments: every invalid
config is refused with BadInput naming a field, no valid config crashes the validator, and no
argument list produces a traceback."""

import contextlib
import io
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_config import FLOAT_FIELDS, INT_FIELDS, as_field_value

from batchscale import names
from batchscale.cli import main
from batchscale.config import MAX_YAML_NODES, ExperimentConfig, load_config, parse_config
from batchscale.errors import BadInput

SECTIONS = ("dataset", "sweep", "convergence", "analysis", "publish")
junk = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                 st.floats(allow_nan=True), st.text(max_size=8),
                 st.lists(st.integers(-5, 5), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
batch_lists = st.lists(st.integers(1, 4096), min_size=1, max_size=8, unique=True)


@st.composite
def valid_configs(draw):
    cfg = {}
    if draw(st.booleans()):
        cfg["sweep"] = {"batch_sizes": draw(batch_lists),
                        "precision": draw(st.sampled_from(["fp32", "bf16"]))}
    if draw(st.booleans()):
        cfg["convergence"] = {
            "batch_sizes": draw(batch_lists),
            "lr_rules": draw(st.lists(st.sampled_from(["constant", "linear", "sqrt"]),
                                      min_size=1, max_size=3)),
            "seeds": draw(st.lists(st.integers(0, 10), min_size=1, max_size=3)),
            "target_val_accuracy": draw(st.floats(0.01, 1.0)),
        }
    if draw(st.booleans()):
        cfg["dataset"] = {"val_fraction": draw(st.floats(0.01, 0.99))}
    return cfg


@given(valid_configs())
@settings(max_examples=60, deadline=None)
def test_valid_configs_parse(data):
    cfg = parse_config(data)
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.config_hash == parse_config(cfg.model_dump(mode="json")).config_hash


@given(valid_configs(), st.sampled_from(SECTIONS), st.text(min_size=1, max_size=10), junk)
@settings(max_examples=80, deadline=None)
def test_unknown_keys_are_refused_naming_the_key(data, section, key, value):
    known = set(ExperimentConfig.model_fields[section].annotation.model_fields)
    if key in known:
        return
    data = {**data, section: {**data.get(section, {}), key: value}}
    with pytest.raises(BadInput) as err:
        parse_config(data)
    assert names.redact_url(f"{section}.{key}") in str(err.value)  # as printed: URLs masked


@given(valid_configs(), st.sampled_from(SECTIONS), junk)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_value_is_either_accepted_or_refused_naming_a_field(data, section, value):
    model = ExperimentConfig.model_fields[section].annotation
    for field in sorted(model.model_fields):
        mutated = {**data, section: {**data.get(section, {}), field: value}}
        try:
            parse_config(mutated)
        except BadInput as err:
            assert f"{section}." in str(err) or "(top level)" in str(err)


@given(st.lists(st.one_of(st.sampled_from(
    ["run", "compile", "sweep", "converge", "validate", "store", "--config", "--batch-sizes",
     "--workers", "--lr-rules", "--lr-rule", "--lr-candidates", "--table", "--out", "--device",
     "--memory-limit-bytes", "--time-budget-s", "--torch-compile", "--no-channels-last",
     "--compile", "auto", "2GiB", "bogus", "-1", "0", "1,2", "x,y", "--help"]),
    st.text(max_size=6)), max_size=5))
@settings(max_examples=60, deadline=None)
def test_cli_arguments_never_crash_before_work(argv):
    # Only parsing and validation run here: lists that could start real work (the pipeline, the
    # store, a sweep writing --out) are left to the end-to-end tests.
    if {"run", "compile", "store", "--out"} & set(argv):
        return
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    assert code in (0, 1, 2, 3), (argv, code)
    assert "Traceback" not in stderr.getvalue()


# ------------------------------------------------------- config files: YAML shapes
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
yaml_trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20)
YAML_CHARS = st.sampled_from(list(":-[]{}&*!|>'\"#?,<@%` \n\tab1.") + ["<<", "&a", "*a", "!!"])


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("configs")


def load_text(folder: Path, text: str | bytes) -> ExperimentConfig | BadInput:
    """load_config on `text` written to a file: a config or the BadInput it raised (any other
    exception fails the test)."""
    path = folder / "c.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    try:
        return load_config(path)
    except BadInput as err:
        return err


@given(yaml_trees, st.sampled_from(SECTIONS), st.booleans())
@settings(max_examples=80, deadline=None)
def test_any_yaml_tree_loads_or_is_refused_as_parse_config_would(config_dir, tree, section,
                                                                   nest):
    data = {section: {"some_field": tree}} if nest else tree
    got = load_text(config_dir, yaml.safe_dump(data))
    try:
        expected = parse_config(data)
    except BadInput as err:
        expected = err
    assert type(got) is type(expected)
    if isinstance(got, ExperimentConfig):
        assert got == expected


@given(st.lists(YAML_CHARS, max_size=60).map("".join))
@settings(max_examples=100, deadline=None)
def test_arbitrary_yaml_text_never_crashes_the_loader(config_dir, text):
    assert isinstance(load_text(config_dir, text), ExperimentConfig | BadInput)


@given(valid_configs(), st.data())
@settings(max_examples=60, deadline=None)
def test_a_repeated_key_is_refused_at_any_level(config_dir, data, draw):
    data = {**data, "analysis": {"saturation_tolerance": 0.2, "bootstrap_samples": 50}}
    section = draw.draw(st.sampled_from(sorted(data)))
    fields = data[section]
    if draw.draw(st.booleans()):  # the whole section twice
        text = yaml.safe_dump(data) + yaml.safe_dump({section: fields})
        key = section
    else:  # one field twice inside its section
        key = draw.draw(st.sampled_from(sorted(fields)))
        body = yaml.safe_dump(fields) + yaml.safe_dump({key: fields[key]})
        text = f"{section}:\n" + "".join(f"  {line}\n" for line in body.splitlines())
    result = load_text(config_dir, text)
    assert isinstance(result, BadInput)
    assert f"repeats the key '{key}' in one mapping" in str(result)


@given(levels=st.integers(1, 8), fan_out=st.integers(1, 9))
@settings(max_examples=60, deadline=None)
def test_alias_expansion_is_refused_exactly_past_the_bound(config_dir, levels, fan_out):
    text = f"x0: &a0 [{', '.join(['v'] * fan_out)}]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan_out)}]\n" for i in range(1, levels))
    size = 1 + fan_out  # the first list and its items
    total = 1 + 1 + size  # the root mapping, the key x0, the first list
    for _ in range(1, levels):
        size = 1 + fan_out * size
        total += 1 + size
    start = time.monotonic()
    result = load_text(config_dir, text)
    assert time.monotonic() - start < 2
    assert isinstance(result, BadInput)
    assert ("expands to more than" in str(result)) == (total > MAX_YAML_NODES), total
    assert ("unknown key" in str(result)) == (total <= MAX_YAML_NODES)


# ------------------------------------------------------------------ numbers in every field
@given(st.data(), st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                            st.integers(-(2**80), 2**80)))
@settings(max_examples=100, deadline=None)
def test_every_number_is_finite_and_int64_or_refused_naming_its_field(draw, value):
    section, name = draw.draw(st.sampled_from(FLOAT_FIELDS + INT_FIELDS))
    try:
        cfg = parse_config({section: {name: as_field_value(section, name, value)}})
    except BadInput as err:  # the field, or its section for a check across fields
        assert f"{section}." in str(err)
        return
    stored = getattr(getattr(cfg, section), name)
    for number in stored if isinstance(stored, list) else [stored]:
        assert math.isfinite(number)
        assert isinstance(number, float) or abs(number) <= 2**63 - 1


# -------------------------------------------------------------------------------- names
@given(st.text(max_size=40))
@settings(max_examples=80, deadline=None)
def test_names_and_buckets_are_accepted_exactly_when_names_py_accepts_them(text):
    for patch, check in (({"name": text}, names.check_name),
                         ({"kubernetes": {"s3_bucket": text}}, names.check_bucket),
                         ({"kubernetes": {"s3_prefix": text}}, names.check_prefix)):
        try:
            check(text)
            allowed = True
        except BadInput:
            allowed = False
        try:
            parse_config(patch)
            accepted = True
        except BadInput:
            accepted = False
        assert accepted == allowed, (patch, accepted)


SECRET = "Pw9zQ7xK"
url_parts = st.text(st.characters(codec="ascii", exclude_characters="@/ \t\n\r"), max_size=20)


@given(st.sampled_from(["s3", "http", "https"]), url_parts, url_parts, url_parts,
       st.sampled_from([("dataset", "source_uri"), ("kubernetes", "s3_endpoint_url"),
                        ("convergence", "checkpoint_uri"), ("", "workload"), ("", "name")]))
@settings(max_examples=100, deadline=None)
def test_a_password_in_any_url_is_never_printed(scheme, user, tail, host, field):
    url = f"{scheme}://{user}:{SECRET}{tail}@{host}/x"
    section, name = field
    data = {name: url} if not section else {section: {name: url}}
    if section == "dataset":
        data["dataset"]["name"] = "cifar10"
    with pytest.raises(BadInput) as err:
        parse_config(data)
    assert SECRET not in str(err.value)
