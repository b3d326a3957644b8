"""`--target` of `batchscale converge`: METRIC=VALUE, or the METRIC>=VALUE / METRIC<=VALUE the
tool itself prints; a bad target's message names --target."""

from __future__ import annotations

import argparse

import pytest

from batchscale.cli.stage_cmds import target_flag
from helpers import run_cli


def test_the_printed_form_of_a_target_is_taken():
    assert target_flag("val_accuracy>=0.9") == {"metric": "val_accuracy", "value": 0.9}
    assert target_flag("val_loss<=0.3") == {"metric": "val_loss", "value": 0.3}
    assert target_flag("val_loss=0.3") == {"metric": "val_loss", "value": 0.3}


def test_a_sign_against_the_metrics_direction_is_refused_with_the_right_form():
    with pytest.raises(argparse.ArgumentTypeError,
                       match="val_accuracy is reached when it is >= the target; write "
                             "val_accuracy=0.9"):
        target_flag("val_accuracy<=0.9")
    with pytest.raises(argparse.ArgumentTypeError, match="is not METRIC=VALUE"):
        target_flag("val_accuracy>0.9")


def test_a_bad_target_value_names_the_target_flag(tmp_path):
    result = run_cli(["converge", "--workload", "digits-mlp", "--batch-sizes", "8",
                      "--target", "val_accuracy=90", "--out", str(tmp_path / "out")],
                     cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert "invalid config given on the command line (--target, " in result.stderr
    assert "convergence.targets.0.value: val_accuracy is a share" in result.stderr
    assert "Traceback" not in result.stderr
