"""The Dockerfiles under images/, checked without building them.

No Docker engine exists on our machines, so these tests read the Dockerfiles and `make -n`
(a dry run that prints the commands without running Docker) instead of building: every path
an image copies exists and reaches the build context, the pins agree with pyproject.toml, the
images run as a non-root user, carry no secrets and start from tagged bases, and `make images`
pushes exactly the tags `make compile` writes into the pipeline YAML.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
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


def test_base_image_is_tagged_and_its_python_satisfies_requires_python(dockerfile):
    bases = [rest.split()[0] for kw, rest in instructions(dockerfile) if kw == "FROM"]
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())
                            ["project"]["requires-python"])
    for base in bases:
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and "$" not in base, f"{base} is not pinned to a tag"
        if name == "python":
            assert requires.contains(tag.split("-")[0]), f"{base} vs requires-python {requires}"


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
