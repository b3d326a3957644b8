"""Config validation: every bad config is refused with a message naming the field."""

import pytest
import yaml

from batchscale.config import (
    DEFAULT_CONFIG_PATH,
    ExperimentConfig,
    load_config,
    parse_config,
    reference_markdown,
    with_overrides,
)
from batchscale.errors import BadInput


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
        ({"sweep": {"unknown_knob": 3}}, "sweep.unknown_knob", "unknown key"),
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

