"""The workload registry: every entry builds, the cheap ones train one step on CPU at a tiny
image size, and bad names are refused with the allowed values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.contract_check import check_workload
from batchscale.errors import BadInput
from batchscale.workloads import TASK_MODULES, WORKLOAD_NAMES, get_workload
from helpers import run_cli

TESTS_DIR = Path(__file__).parent

TINY_IMAGE_PX = 32
DETECTION_IMAGE_PX = 64
STEP_BATCH = 2
# fasterrcnn_resnet50_fpn resizes every image to 800 px inside the model: a CPU step takes
# tens of seconds, so it is built but not stepped here (benchmarks/bench_sweep.py runs the
# cheaper detector end to end).
BUILD_ONLY = {"fasterrcnn_resnet50_fpn", "fcn_resnet50"}


def tiny_conv():
    """A user factory (imported as `test_workloads:tiny_conv`)."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 10))


def returns_int():
    """A factory that returns no model (`test_workloads:returns_int`)."""
    return 42


def returns_none():
    return None


def returns_text():
    return "http://u:Pw9zQ7xK@h " + "x" * 1000


def raises():
    raise RuntimeError("the user's model is broken")


def one_step(name: str, image_px: int) -> tuple[float, float]:
    """(loss, gradient norm) after one SGD step on a synthetic batch."""
    workload = get_workload(name, image_size=image_px)
    torch.manual_seed(0)
    model = workload.build()
    model.train()
    loss = workload.contract_for().loss(model, workload.synthetic_batch(STEP_BATCH, "cpu"))
    loss.backward()
    grad = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    return loss.item(), grad.item()


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_every_registered_workload_builds(name):
    workload = get_workload(name, image_size=TINY_IMAGE_PX)
    model = workload.build()
    assert sum(p.numel() for p in model.parameters()) > 0
    assert workload.kind in TASK_MODULES
    assert workload.metrics  # every kind of task says what a trial of it measures


@pytest.mark.parametrize("name", [n for n in WORKLOAD_NAMES if n not in BUILD_ONLY])
def test_cheap_workloads_train_one_step_on_cpu(name):
    image_px = DETECTION_IMAGE_PX if name.startswith("fasterrcnn") else TINY_IMAGE_PX
    loss, grad = one_step(name, image_px)
    assert torch.isfinite(torch.tensor(loss)) and loss > 0
    assert grad > 0


def test_detection_batches_carry_synthetic_boxes_inside_the_image():
    workload = get_workload("fasterrcnn_mobilenet_v3_large_320_fpn", image_size=64)
    images, targets = workload.synthetic_batch(3, "cpu")
    assert len(images) == len(targets) == 3
    for image, target in zip(images, targets, strict=True):
        boxes = target["boxes"]
        assert image.shape == (3, 64, 64)
        assert (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all() and (boxes <= 64).all()
        assert ((target["labels"] >= 1) & (target["labels"] < workload.num_classes)).all()


def test_image_size_sets_the_input_shape():
    assert get_workload("resnet18", image_size=48).input_shape == (3, 48, 48)
    assert get_workload("resnet18", image_size=48).is_image
    assert not get_workload("digits-mlp").is_image


def test_vit_needs_a_multiple_of_its_patch_size():
    with pytest.raises(BadInput, match="multiple of 16"):
        get_workload("vit_b_16", image_size=30)


def test_unknown_workload_lists_the_allowed_names():
    with pytest.raises(BadInput, match="allowed: digits-mlp"):
        get_workload("resnet19")


def test_user_factory_workload_trains():
    loss, grad = one_step("test_workloads:tiny_conv", TINY_IMAGE_PX)
    assert loss > 0 and grad > 0


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:build", "cannot import module"),
    ("test_workloads:not_there", "has no callable"),
])
def test_bad_user_factory_is_refused(spec, message):
    with pytest.raises(BadInput, match=message):
        get_workload(spec)


def test_a_found_module_whose_own_import_is_missing_names_what_to_install(tmp_path,
                                                                         monkeypatch):
    """The user's module is there: moving it or PYTHONPATH would not help, installing would."""
    (tmp_path / "needs_a_pkg.py").write_text("import not_installed_pkg_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BadInput) as refused:
        get_workload("needs_a_pkg:build")
    assert ("module 'needs_a_pkg' was found, but it imports 'not_installed_pkg_xyz', which is "
            "not installed where batchscale runs") in str(refused.value)
    assert "PYTHONPATH" not in str(refused.value)


def test_a_module_named_without_its_attribute_is_pointed_at_the_form(tmp_path, monkeypatch):
    (tmp_path / "tinybert.py").write_text("workload = None\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput, match=r"tinybert.py is here: name what in it to use, e.g. "
                                       r"'tinybert:workload'"):
        get_workload("tinybert")


def test_cli_lists_the_registry():
    out = subprocess.run([sys.executable, "-m", "batchscale.cli", "workloads"],
                         capture_output=True, text=True, check=True).stdout
    for name in WORKLOAD_NAMES:
        assert name in out
    assert "package.module:factory" in out


# ------------------------------------------------- factories run code: what they may be
STDLIB_FACTORIES = ["os:system", "builtins:eval", "builtins:breakpoint", "builtins:exec",
                    "subprocess:Popen", "importlib:import_module", "runpy:run_path",
                    "code:interact", "pdb:set_trace", "shutil:rmtree", "os.path:join",
                    "importlib.metadata:version", "sys:exit", "this:x", "antigravity:x",
                    "__main__:main"]


@pytest.mark.parametrize("spec", STDLIB_FACTORIES)
def test_standard_library_factories_are_refused(spec):
    with pytest.raises(BadInput, match="standard library") as err:
        get_workload(spec)
    assert spec in str(err.value)


importable_stdlib = sorted(name for name in sys.stdlib_module_names
                           if name.isidentifier() and name.isascii())


@given(st.sampled_from(importable_stdlib), st.sampled_from(["", ".sub", ".a.b"]),
       st.sampled_from(["x", "main", "system", "_private"]))
@settings(max_examples=100, deadline=None)
def test_no_standard_library_module_is_imported_for_a_factory(module, sub, attr):
    was_imported = module in sys.modules
    with pytest.raises(BadInput, match="standard library"):
        get_workload(f"{module}{sub}:{attr}")
    assert (module in sys.modules) == was_imported


def test_importing_this_prints_nothing_before_the_refusal(tmp_path):
    """`import this` prints the Zen of Python: the refusal comes before any import."""
    result = run_cli(["sweep", "--workload", "this:x", "--out", "s.parquet"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == "" and "Beautiful is better" not in result.stderr
    assert "standard library" in result.stderr


@pytest.mark.parametrize(("spec", "shown"), [
    ("test_workloads:returns_int", "returned int 42"),
    ("test_workloads:returns_none", "returned NoneType None"),
    ("test_workloads:returns_text", "returned str"),
])
def test_a_factory_must_return_a_module_before_it_is_used(spec, shown):
    workload = get_workload(spec)  # importing is fine; the result is checked when built
    for build in (workload.build, lambda: check_workload(workload)):
        with pytest.raises(BadInput, match="not a torch.nn.Module") as err:
            build()
        message = str(err.value)
        assert spec in message and shown in message
        assert "Pw9zQ7xK" not in message and len(message) < 400


def test_a_failing_factory_is_bad_input_up_front_and_itself_in_a_trial():
    with pytest.raises(BadInput, match="the factory failed: RuntimeError: the user's model"):
        check_workload(get_workload("test_workloads:raises"))
    with pytest.raises(RuntimeError):  # in a trial: an error row (or an oom), not bad input
        get_workload("test_workloads:raises").build()
    check_workload(get_workload("test_workloads:tiny_conv"))
    check_workload(get_workload("digits-mlp"))


def test_a_module_whose_import_fails_is_bad_input(tmp_path, monkeypatch):
    (tmp_path / "broken_user_module.py").write_text("raise ValueError('bad top level')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BadInput, match="importing module 'broken_user_module' failed: "
                                       "ValueError: bad top level"):
        get_workload("broken_user_module:build")


@pytest.mark.parametrize("command", ["sweep", "converge"])
def test_cli_refuses_a_factory_returning_no_module_and_writes_nothing(tmp_path, command):
    out = tmp_path / ("out" if command == "converge" else "s.parquet")
    result = run_cli([command, "--workload", "test_workloads:returns_int", "--batch-sizes", "4",
                      "--out", str(out)], cwd=tmp_path, env={"PYTHONPATH": str(TESTS_DIR)},
                     timeout_s=300)
    assert result.returncode == 2, result.stderr
    assert "returned int 42, not a torch.nn.Module" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_says_a_factory_runs_your_code():
    for command in ("sweep", "converge"):
        help_text = " ".join(run_cli([command, "--help"], cwd=TESTS_DIR).stdout.split())
        assert "runs your code with your rights, like any Python import" in help_text
        assert "standard library are refused" in help_text


def test_a_factorys_first_build_follows_the_torch_seed(tmp_path, monkeypatch):
    """Resolving a factory calls it once to see what it returns; that model was built from
    whatever state torch's generator had then (a random seed per process), so the first build
    must not hand it on: every build after manual_seed(s) gets seed s's weights."""
    (tmp_path / "seed_following_model.py").write_text(
        "import torch.nn as nn\n\n\ndef build():\n    return nn.Linear(8, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import torch

    torch.manual_seed(12345)  # the state the check's call draws from: not the trial's seed
    workload = get_workload("seed_following_model:build")
    builds = []
    for _ in range(2):
        torch.manual_seed(0)
        builds.append(workload.build())
    first, second = (b.state_dict() for b in builds)
    assert all(torch.equal(first[k], second[k]) for k in first)
