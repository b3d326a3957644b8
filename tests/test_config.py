"""Config validation: every bad config is refused with a message naming the field."""

import pytest
import yaml

from batchscale.config import (
    DEFAULT_CONFIG_PATH,
    ExperimentConfig,
    load_config,
    parse_config,
    reference_markdown,
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
