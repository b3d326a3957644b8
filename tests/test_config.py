"""Config validation: every bad config is refused with a message naming the field; a config
file is read with bounds (kind, size, encoding, repeated keys, aliases, depth)."""

import math
import types
import typing
from pathlib import Path

import pytest
import yaml
from test_config_reading import ALIAS_BOMB

from batchscale.config import (
    DEFAULT_CONFIG_PATH,
    MAX_BATCH_SIZE,
    MAX_SECONDS,
    ExperimentConfig,
    load_config,
    parse_config,
    reference_markdown,
    section_models,
    with_overrides,
)
from batchscale.errors import BadInput
from helpers import run_cli


def test_default_config_loads_and_meets_the_embedded_default_floor():
    cfg = load_config()
    assert cfg.workload == "digits-mlp" and cfg.dataset.name == "digits"
    assert len(cfg.sweep.batch_sizes) >= 6
    b = cfg.convergence.batch_sizes
    assert len(b) >= 6 and max(b) / min(b) >= 100
    assert cfg == load_config(DEFAULT_CONFIG_PATH)


@pytest.mark.parametrize(
    ("patch", "field", "needle"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"sweep": {"batch_sizes": [4, "a"]}}, "sweep.batch_sizes.1", "integer"),
        ({"sweep": {"batch_sizes": [0, 4]}}, "sweep.batch_sizes.0", "greater than 0"),
        ({"sweep": {"batch_sizes": [-4]}}, "sweep.batch_sizes.0", "greater than 0"),
        ({"convergence": {"batch_sizes": [4.5]}}, "convergence.batch_sizes.0", "integer"),
        ({"convergence": {"batch_sizes": []}}, "convergence.batch_sizes", "at least 1"),
        ({"convergence": {"batch_sizes": [4, 4]}}, "convergence.batch_sizes", "distinct"),
        ({"convergence": {"lr_rules": ["cosine"]}}, "convergence.lr_rules.0", "linear"),
        ({"convergence": {"workers": 0}}, "convergence.workers", "greater than 0"),
        ({"dataset": {"name": "imagenet"}}, "dataset.name", "allowed: digits"),
        ({"workload": "gpt5"}, "workload", "allowed: digits-mlp"),
        ({"sweep": {"device": "tpu"}}, "sweep.device", "auto"),
        ({"sweep": {"unknown_knob": 3}}, "sweep.unknown_knob", "unknown key (got 3)"),
        ({"convergence": {"batch_size": [8]}}, "convergence.batch_size",
         'unknown key (did you mean "batch_sizes"?)'),
        ({"convergance": {}}, "convergance", 'unknown key (did you mean "convergence"?)'),
        ({"convergence": {"checkpoint_uri": "/etc"}}, "convergence.checkpoint_uri", "leave"),
        ({"convergence": {"checkpoint_uri": "a/../../b"}}, "convergence.checkpoint_uri", "leave"),
    ],
)
def test_bad_config_names_the_field(patch, field, needle):
    with pytest.raises(BadInput) as err:
        parse_config(patch, "test.yaml")
    message = str(err.value)
    assert f"{field}:" in message
    assert needle in message
    assert "test.yaml" in message


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(BadInput, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sweep: [unclosed\n")
    with pytest.raises(BadInput, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(BadInput, match="mapping"):
        load_config(scalar)


def test_batch_sizes_are_sorted_and_hash_is_stable():
    a = parse_config({"sweep": {"batch_sizes": [64, 1, 8]}})
    b = parse_config(yaml.safe_load(yaml.safe_dump({"sweep": {"batch_sizes": [1, 8, 64]}})))
    assert a.sweep.batch_sizes == [1, 8, 64]
    assert a.config_hash == b.config_hash
    assert a.config_hash != ExperimentConfig().config_hash


def test_user_factory_names_pass_config_validation():
    assert parse_config({"workload": "mypkg.models:build"}).workload == "mypkg.models:build"


def test_reference_documents_every_field():
    text = reference_markdown()
    for section in ("dataset", "sweep", "convergence", "analysis", "publish"):
        model = ExperimentConfig.model_fields[section].annotation
        for name, field in model.model_fields.items():
            assert f"`{name}`" in text
            assert field.description, f"{section}.{name} has no docstring"


@pytest.mark.parametrize(("size", "expected"), [
    ("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096),
    (4096, 4096), ("512 MB", 512_000_000), (None, None),
])
def test_memory_sizes_parse_to_an_int_of_bytes(size, expected):
    value = parse_config({"sweep": {"memory_limit_bytes": size}}).sweep.memory_limit_bytes
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("size", ["2XB", "", "-1GiB", "0", "GiB", 0, -5, True, 1.5, 2.0])
def test_bad_memory_sizes_name_the_field_and_the_allowed_forms(size):
    with pytest.raises(BadInput) as err:
        parse_config({"sweep": {"memory_limit_bytes": size}}, "test.yaml")
    assert "sweep.memory_limit_bytes: expected a positive number of bytes" in str(err.value)
    assert "512MB or 2GiB" in str(err.value)


def test_memory_size_hashes_as_its_bytes():
    as_text = parse_config({"sweep": {"memory_limit_bytes": "2GiB"}})
    as_int = parse_config({"sweep": {"memory_limit_bytes": 2 * 2**30}})
    assert as_text.config_hash == as_int.config_hash
    assert '"memory_limit_bytes": 2147483648' in as_text.to_json()


def test_overrides_are_validated_like_a_file():
    cfg = load_config()
    assert with_overrides(cfg, {}, "flags") is cfg
    changed = with_overrides(cfg, {"workload": "digits-cnn",
                                   "sweep": {"batch_sizes": [8, 2], "time_budget_s": 0.5}}, "flags")
    assert changed.workload == "digits-cnn" and changed.sweep.batch_sizes == [2, 8]
    assert changed.sweep.time_budget_s == 0.5
    assert changed.sweep.precision == cfg.sweep.precision and changed.dataset == cfg.dataset
    with pytest.raises(BadInput, match=r"invalid config flags:\n  sweep.time_budget_s: .*0"):
        with_overrides(cfg, {"sweep": {"time_budget_s": 0}}, "flags")



# ------------------------------------------------------------ what an error message quotes
def refused_dict(data: dict) -> BadInput:
    with pytest.raises(BadInput) as err:
        parse_config(data, "test.yaml")
    return err.value


def test_error_messages_quote_a_bounded_value_and_list_at_most_20_fields():
    message = str(refused_dict({"workload": "x" * 100_000}))
    assert len(message) < 700 and "…" in message
    many = str(refused_dict({"convergence": {"batch_sizes": [-1] * 5000}}))
    assert many.count("\n") == 21 and many.endswith("... and 4980 more fields")
    nested = str(refused_dict({"sweep": {"batch_sizes": [[[[[[[[[[[[1]]]]]]]]]]] * 1000]}}))
    assert len(nested) < 2000


@pytest.mark.parametrize("data", [
    {"dataset": {"name": "cifar10", "source_uri": "s3://AKIAKEY:Pw9zQ7xK@bucket/x"}},
    {"kubernetes": {"s3_endpoint_url": "http://user:Pw9zQ7xK@host:9000"}},
    {"convergence": {"checkpoint_uri": "s3://user:Pw9zQ7xK@bucket/ckpt"}},
    {"workload": "s3://user:Pw9zQ7xK@bucket/x"},
    {"workload": "s3://user:" + "Pw9zQ7xK" * 500 + "@bucket/x"},  # cut before the '@'
    {"name": "http://user:Pw9zQ7xK@host/" + "x" * 5000},
])
def test_credentials_in_a_refused_value_are_never_printed(data):
    message = str(refused_dict(data))
    assert "Pw9zQ7xK" not in message and "***" in message


# --------------------------------------------------------------------------------- numbers
def _numeric_fields(kind: type) -> list[tuple[str, str]]:
    """(section, field) of every field whose values are `kind` (alone, optional or a list)."""
    found = []
    for section, model in section_models().items():
        for name, field in model.model_fields.items():
            if kind in _leaf_types(field.annotation):
                found.append((section, name))
    return found


def _leaf_types(annotation) -> set:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (list, typing.Union, types.UnionType):
        return {t for arg in typing.get_args(annotation) for t in _leaf_types(arg)}
    return {annotation}


FLOAT_FIELDS = _numeric_fields(float)
INT_FIELDS = _numeric_fields(int)


def _is_list(annotation) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_list(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(arg) for arg in typing.get_args(annotation))
    return origin is list


def as_field_value(section: str, name: str, value):
    """`value` as the field takes it: alone, or as the one item of a list field."""
    is_list = _is_list(section_models()[section].model_fields[name].annotation)
    return [value] if is_list else value


def test_every_numeric_field_is_found():
    assert ("convergence", "lr_candidates") in FLOAT_FIELDS
    assert ("convergence", "timeout_s") in FLOAT_FIELDS
    assert ("sweep", "time_budget_s") in FLOAT_FIELDS
    assert ("convergence", "seeds") in INT_FIELDS and ("sweep", "max_batch_size") in INT_FIELDS
    assert len(FLOAT_FIELDS) >= 13 and len(INT_FIELDS) >= 25


@pytest.mark.parametrize(("section", "name"), FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_no_float_field_takes_inf_or_nan(section, name, value):
    err = refused_dict({section: {name: as_field_value(section, name, value)}})
    assert f"{section}.{name}" in str(err) and "finite" in str(err)


@pytest.mark.parametrize(("section", "name"), INT_FIELDS)
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_no_int_field_takes_a_value_beyond_int64(section, name, value):
    assert f"{section}.{name}" in str(refused_dict(
        {section: {name: as_field_value(section, name, value)}}))


@pytest.mark.parametrize(("section", "name"), [
    ("sweep", "batch_sizes"), ("convergence", "batch_sizes"), ("sweep", "max_batch_size"),
    ("convergence", "scaling_batch_sizes"), ("convergence", "reference_batch_size")])
def test_batch_sizes_stop_at_2_to_the_31(section, name):
    top = MAX_BATCH_SIZE
    assert top == 2**31
    message = str(refused_dict({section: {name: as_field_value(section, name, top + 1)}}))
    assert f"less than or equal to {top}" in message
    if section == "sweep":  # the largest one is fine
        assert parse_config({section: {name: as_field_value(section, name, top)}})


@pytest.mark.parametrize(("patch", "field"), [
    ({"convergence": {"timeout_s": MAX_SECONDS + 1}}, "convergence.timeout_s"),
    ({"sweep": {"time_budget_s": 1e300}}, "sweep.time_budget_s"),
    ({"kubernetes": {"stage_timeout_s": 2**40}}, "kubernetes.stage_timeout_s"),
    ({"convergence": {"base_lr": 1e300}}, "convergence.base_lr"),
    ({"convergence": {"seeds": [-1]}}, "convergence.seeds.0"),
    ({"convergence": {"seeds": [2**32]}}, "convergence.seeds.0"),
    ({"dataset": {"split_seed": -1}}, "dataset.split_seed"),
    ({"analysis": {"bootstrap_samples": 10**9}}, "analysis.bootstrap_samples"),
    ({"dataset": {"synthetic_train_rows": 10**12}}, "dataset.synthetic_train_rows"),
    ({"dataset": {"name": "teacher-student", "synthetic_train_rows": 9_000_000,
                  "val_fraction": 0.5}}, "dataset.synthetic_train_rows"),
])
def test_numbers_past_their_stated_bound_are_refused(patch, field):
    assert f"{field}:" in str(refused_dict(patch))


@pytest.mark.parametrize("size", ["1e400", "0.5", "1.0e+400", "2GiB junk", "1.5", "1 e",
                                  2**63, "9999999999 TiB", math.inf, "1_000"])
def test_memory_sizes_beyond_the_allowed_forms_are_refused(size):
    message = str(refused_dict({"sweep": {"memory_limit_bytes": size}}))
    assert "sweep.memory_limit_bytes: expected a positive number of bytes" in message
    assert "at most 2**63-1 bytes" in message
    assert f"(got {size!r})" in message


# ---------------------------------------------------------------------------------- names
@pytest.mark.parametrize(("patch", "field", "needle"), [
    ({"name": "../../x"}, "name", "experiment name '../../x' is not allowed"),
    ({"name": "a/b"}, "name", "is not allowed"),
    ({"name": "x\n"}, "name", "is not allowed"),
    ({"name": ""}, "name", "is not allowed"),
    ({"kubernetes": {"s3_bucket": "Bad_Bucket!"}}, "kubernetes.s3_bucket", "valid S3 bucket"),
    ({"kubernetes": {"s3_bucket": "b" * 300}}, "kubernetes.s3_bucket", "valid S3 bucket"),
    ({"kubernetes": {"s3_prefix": "a/b/../c"}}, "kubernetes.s3_prefix", "is not allowed"),
    ({"kubernetes": {"s3_endpoint_url": "http://"}}, "kubernetes.s3_endpoint_url", "http://"),
    ({"kubernetes": {"s3_endpoint_url": "http://127.0.0.1:99999"}},
     "kubernetes.s3_endpoint_url", "not a valid URL"),
    ({"kubernetes": {"s3_endpoint_url": "http://[::1"}}, "kubernetes.s3_endpoint_url",
     "not a valid URL"),
    ({"kubernetes": {"s3_endpoint_url": "http://h:9000/path?q=1"}}, "kubernetes.s3_endpoint_url",
     "no path, query or fragment"),
    ({"dataset": {"name": "cifar10", "source_uri": "s3://Bad_Bucket!/x"}}, "dataset.source_uri",
     "valid S3 bucket"),
    ({"dataset": {"name": "cifar10", "source_uri": "s3://bucket/a/../c"}},
     "dataset.source_uri", "is not allowed"),
    ({"dataset": {"name": "cifar10", "source_uri": "s3://" + "b" * 300}},
     "dataset.source_uri", "valid S3 bucket"),
    ({"dataset": {"name": "parquet", "source_uri": "https://host/x.parquet"}},
     "dataset.source_uri", "neither a local path nor s3://bucket/prefix"),
    ({"convergence": {"checkpoint_uri": "s3://Bad_Bucket!/x"}}, "convergence.checkpoint_uri",
     "valid S3 bucket"),
    ({"kubernetes": {"node_selector": {f"k{i}": "v" for i in range(65)}}},
     "kubernetes.node_selector", "at most 64"),
    ({"kubernetes": {"tolerations": [{"operator": "Exists"}] * 65}}, "kubernetes.tolerations",
     "at most 64"),
    ({"kubernetes": {"service_account": "x" * 5000}}, "kubernetes.service_account",
     "at most 4096 characters"),
])
def test_names_and_s3_settings_are_checked(patch, field, needle):
    message = str(refused_dict(patch))
    assert f"{field}: " in message and needle in message, message


@pytest.mark.parametrize("patch", [
    {"name": "my-experiment_2.b"},
    {"kubernetes": {"s3_prefix": "/team/batchscale/", "s3_bucket": "my.bucket-1",
                    "s3_endpoint_url": "https://s3.example.com"}},
    {"dataset": {"name": "cifar10", "source_uri": "s3://bucket"}},
    {"dataset": {"name": "cifar10", "source_uri": "data/cifar"}},
    {"dataset": {"name": "parquet", "source_uri": "/abs/path/x.parquet"}},
    {"convergence": {"checkpoint_uri": "s3://bucket/ckpt"}},
])
def test_valid_names_keep_their_value(patch):
    cfg = parse_config(patch).model_dump()
    for section, value in patch.items():
        got = {k: cfg[section][k] for k in value} if isinstance(value, dict) else cfg[section]
        assert got == value


# ------------------------------------------------------------------------ the CLI's answer
@pytest.mark.parametrize(("text", "needle"), [
    (ALIAS_BOMB, "expands to more than"),
    ("convergence:\n  timeout_s: .inf\n", "convergence.timeout_s: Input should be a finite"),
    ("sweep:\n  device: cpu\nsweep:\n  device: cuda\n", "repeats the key 'sweep'"),
    ("name: caf\xe9\n".encode("latin-1"), "is not UTF-8 text"),
    ("kubernetes:\n  s3_endpoint_url: http://user:Pw9zQ7xK@h:9000\n", "carries credentials"),
])
def test_compile_refuses_bad_config_files_with_exit_2(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    result = run_cli(["compile", "--config", "c.yaml"], cwd=tmp_path, timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert "Pw9zQ7xK" not in result.stderr + result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_compile_takes_the_largest_allowed_numbers(tmp_path):
    """The bounds keep what compile derives from them (pod deadlines) in range."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "convergence": {"timeout_s": MAX_SECONDS},
        "kubernetes": {"stage_timeout_s": MAX_SECONDS, "convergence_timeout_margin_s": MAX_SECONDS},
        "sweep": {"time_budget_s": MAX_SECONDS, "max_batch_size": MAX_BATCH_SIZE}}))
    result = run_cli(["compile", "--config", "c.yaml"], cwd=tmp_path, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "pipeline.yaml").exists()


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "batchscale" / "configs")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_is_valid(path):
    """The configs the docs point to (`make local-run CONFIG=…`) load as they are."""
    cfg = load_config(path)
    assert cfg.name and cfg.convergence.fan_out(one_batch_size_per_cell=False)


def test_the_lr_rule_once_called_grid_is_read_as_tuned_with_a_note(capsys):
    """"grid" named both the strategy that trains every listed batch size and the LR rule that
    tries every candidate learning rate; the rule is now `tuned`, its list `lr_candidates`."""
    cfg = parse_config({"convergence": {"lr_rules": ["grid", "sqrt"], "lr_grid": [0.1, 0.2]}},
                       "old.yaml")
    assert (cfg.convergence.lr_rules, cfg.convergence.lr_candidates) == (["tuned", "sqrt"],
                                                                         [0.1, 0.2])
    assert cfg.convergence.strategy == "grid"  # the one meaning "grid" keeps
    err = capsys.readouterr().err
    assert "convergence.lr_grid is now convergence.lr_candidates" in err
    assert "convergence.lr_rules: 'grid' is now 'tuned'" in err
    with pytest.raises(BadInput, match="both set; lr_grid is the old name of lr_candidates"):
        parse_config({"convergence": {"lr_grid": [0.1], "lr_candidates": [0.1]}}, "both.yaml")


def test_the_sweeps_old_warmup_key_is_read_as_untimed_steps_with_a_note(capsys):
    """sweep.warmup_steps (untimed steps) shared its name with convergence.warmup_steps (the LR
    warm-up); the old key is still read, says so, and is refused beside the new one."""
    cfg = parse_config({"sweep": {"warmup_steps": 3}}, "old.yaml")
    assert cfg.sweep.untimed_steps == 3 and cfg.convergence.warmup_steps == 20
    assert "sweep.warmup_steps is now sweep.untimed_steps" in capsys.readouterr().err
    with pytest.raises(BadInput, match="both set; warmup_steps is the old name of untimed_steps"):
        parse_config({"sweep": {"warmup_steps": 3, "untimed_steps": 2}}, "both.yaml")


def test_a_misspelt_workload_name_is_refused_with_the_name_it_is_closest_to():
    import pydantic

    from batchscale.config import ExperimentConfig

    with pytest.raises(pydantic.ValidationError, match=r"unknown workload 'digits-mpl' \(did "
                       r"you mean 'digits-mlp'\?\)"):
        ExperimentConfig.model_validate({"workload": "digits-mpl"})
