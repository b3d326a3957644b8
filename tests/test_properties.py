"""Property-based tests (hypothesis) over the config schema and the CLI arguments: every invalid
config is refused with BadInput naming a field, no valid config crashes the validator, and no
argument list produces a traceback."""

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscale.cli import main
from batchscale.config import ExperimentConfig, parse_config
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
    assert f"{section}.{key}" in str(err.value)


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
     "--workers", "--lr-rules", "--lr-rule", "--lr-grid", "--table", "--out", "--device",
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
