"""The layer rules of docs/architecture.md, checked on the source.

`lint-imports` (contracts in .importlinter) checks the `batchscale` package. The KFP layer is
installed under mapped names (batchscale.components -> components/, batchscale.pipelines ->
pipelines/) that the import graph cannot follow, so its rules are checked here from the AST.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"batchscale.components": ROOT / "components", "batchscale.pipelines": ROOT / "pipelines"}
TOP_LAYERS = ("batchscale.cli", "batchscale.kfp_client")
SOURCE_DIRS = ("batchscale", "components", "pipelines")


def _batchscale_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a batchscale module in `path`, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("batchscale")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.startswith("batchscale"):
            found.append((node.lineno, node.module))
            # `from batchscale.x import y` may name a submodule y: resolve it too when it is one.
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if _source_of(f"{node.module}.{a.name}") is not None]
    return found


def _source_of(module: str) -> Path | None:
    """The file or package directory that `module` is loaded from, or None."""
    for prefix, folder in MAPPED.items():
        if module == prefix or module.startswith(prefix + "."):
            base, rest = folder, module[len(prefix):].lstrip(".").split(".")
            break
    else:
        base, rest = ROOT / "batchscale", module.split(".")[1:]
    target = base.joinpath(*[p for p in rest if p])
    if target.with_suffix(".py").is_file():
        return target.with_suffix(".py")
    if (target / "__init__.py").is_file():
        return target
    return None


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_import_names_a_module_that_exists_at_that_path():
    missing = [f"{path.relative_to(ROOT)}:{line}: {module}"
               for folder in SOURCE_DIRS for path in _sources(folder)
               for line, module in _batchscale_imports(path) if _source_of(module) is None]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_only_pipelines_import_the_components_and_only_the_cli_imports_the_pipelines():
    wrong = []
    for folder in SOURCE_DIRS:
        for path in _sources(folder):
            rel = path.relative_to(ROOT)
            module = ".".join(rel.with_suffix("").parts)
            for line, imported in _batchscale_imports(path):
                if imported.startswith("batchscale.components") and folder not in (
                        "pipelines", "components"):
                    wrong.append(f"{rel}:{line}: {imported}")
                if imported.startswith("batchscale.pipelines") and folder != "pipelines" and \
                        not module.startswith(TOP_LAYERS):
                    wrong.append(f"{rel}:{line}: {imported}")
    assert not wrong, "the KFP layer is imported from below it:\n" + "\n".join(wrong)


def test_components_are_thin_and_import_no_layer_above_them():
    for path in _sources("components"):
        for line, imported in _batchscale_imports(path):
            assert not imported.startswith((*TOP_LAYERS, "batchscale.pipelines")), \
                f"{path.relative_to(ROOT)}:{line} imports {imported}"
            other_components = imported.startswith("batchscale.components")
            assert not other_components, f"{path.relative_to(ROOT)}:{line}: a component " \
                f"imports another component ({imported}); share code through batchscale/"


def test_stages_learn_about_a_model_only_through_the_public_contract():
    """Only the catalog (workloads.py) and the built-ins' bridge to the contract
    (tasks/builtin.py) touch a task module; every stage reads a contract Workload, the user's or
    a built-in's, so a built-in has no private path."""
    allowed = {ROOT / "batchscale" / "workloads.py"}
    wrong = []
    for folder in SOURCE_DIRS:
        for path in _sources(folder):
            if path in allowed or path.parent == ROOT / "batchscale" / "tasks":
                continue
            rel = path.relative_to(ROOT)
            wrong += [f"{rel}:{line}: imports {imported}"
                      for line, imported in _batchscale_imports(path)
                      if imported.startswith("batchscale.tasks")]
            wrong += [f"{rel}:{node.lineno}: reads .task"
                      for node in ast.walk(ast.parse(path.read_text(), str(path)))
                      if isinstance(node, ast.Attribute) and node.attr == "task"]
    assert not wrong, "a stage goes around the workload contract:\n" + "\n".join(wrong)


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is not installed: `make test` installs the dev extras")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " 0 broken" in result.stdout, result.stdout[-4000:]


def test_code_comments_say_why_not_which_issue_asked():
    """History belongs in git, not in docstrings: no "issue N" in the code, tests, benchmarks
    or configs."""
    cited = []
    for folder in ("batchscale", "tests", "benchmarks", "components", "pipelines", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".yaml", ".sh") and path.is_file():
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    if re.search(r"\bissue #?\d+", line, re.IGNORECASE):
                        cited.append(f"{path.relative_to(ROOT)}:{number}")
    assert cited == []
