"""manifests/: the RBAC for `convergence.launcher: kubeflow`, as `kubectl apply -k` renders it,
validated against the Kubernetes API schemas (kubernetes-validate, strict: an unknown field
fails) and compared with what full Kubeflow already grants.

No API server runs here: the schemas are the offline stand-in for its validation. The
kustomization is rendered by `render` below (the few kustomize features it uses, and nothing
else: an unknown key fails the test); where `kubectl` is installed, its built-in kustomize
must render the same objects.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFESTS = Path(__file__).parent.parent / "manifests"
RBAC = MANIFESTS / "rbac-trainjob"
KUBERNETES_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
"""The newest three Kubernetes minor releases whose schemas kubernetes-validate 1.37 ships
(offline, inside the package)."""
TRAINER_EDIT_RULES = {
    ("trainer.kubeflow.org", "trainjobs"): {"create", "patch", "get", "list", "watch", "delete"},
    ("trainer.kubeflow.org", "trainingruntimes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/log"): {"get", "list", "watch"},
    ("", "events"): {"get", "list", "watch"},
}
"""ClusterRole kubeflow-trainer-edit of kubeflow/trainer v2.3.0 (manifests/overlays/
kubeflow-platform/kubeflow-trainer-roles.yaml), aggregated into kubeflow-edit, which the profile
controller binds to each profile's default-editor account (kubeflow/kubeflow components/
profile-controller/controllers/profile_controller.go): what multi-user KFP runs already have."""
TRAINER_AUTHENTICATED_CLUSTER_RULES = {
    ("trainer.kubeflow.org", "clustertrainingruntimes"): {"get", "list", "watch"}}
"""ClusterRole kubeflow-trainer-view-cluster-runtimes of the same file, bound to the group
system:authenticated."""


# ------------------------------------------------------------------------ the renderer
KNOWN_KEYS = {"apiVersion", "kind", "namespace", "resources", "labels", "patches",
              "replacements"}


def _load_resources(directory: Path, kustomization: dict) -> list[dict]:
    objects = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        objects += render(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    return objects


def _matches(obj: dict, selector: dict) -> bool:
    return all(obj["metadata"]["name"] == v if k == "name" else obj[k] == v
               for k, v in selector.items())


def _pointer_set(obj: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _pointer_get(obj: dict, path: str):
    node = obj
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _apply_patch(objects: list[dict], patch: dict) -> None:
    """An inline JSON 6902 patch of `replace` operations."""
    assert set(patch) == {"target", "patch"}, patch
    for op in yaml.safe_load(patch["patch"]):
        assert op["op"] == "replace", op
        for obj in (o for o in objects if _matches(o, patch["target"])):
            _pointer_set(obj, op["path"].strip("/").replace("/", "."), op["value"])


def _apply_replacement(objects: list[dict], replacement: dict) -> None:
    source = replacement["source"]
    (origin,) = [o for o in objects if _matches(o, {k: v for k, v in source.items()
                                                     if k != "fieldPath"})]
    value = _pointer_get(origin, source["fieldPath"])
    for target in replacement["targets"]:
        for obj in (o for o in objects if _matches(o, target["select"])):
            for path in target["fieldPaths"]:
                _pointer_set(obj, path, value)


def render(directory: Path) -> list[dict]:
    """The subset of kustomize that manifests/ uses, in kustomize's order: resources, labels,
    patches, namespace (namespaced kinds only; subjects of bindings untouched unless named
    'default', which ours are not), then replacements."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert set(kustomization) <= KNOWN_KEYS, set(kustomization) - KNOWN_KEYS
    objects = copy.deepcopy(_load_resources(directory, kustomization))
    for label in kustomization.get("labels", []):
        assert set(label) == {"pairs"}, label  # no selectors touched
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(label["pairs"])
    for patch in kustomization.get("patches", []):
        _apply_patch(objects, patch)
    if "namespace" in kustomization:
        for obj in objects:
            if not obj["kind"].startswith("Cluster"):
                obj["metadata"]["namespace"] = kustomization["namespace"]
    for replacement in kustomization.get("replacements", []):
        _apply_replacement(objects, replacement)
    return objects


def by_kind(objects: list[dict]) -> dict[str, dict]:
    found = {o["kind"]: o for o in objects}
    assert len(found) == len(objects), "one object of each kind"
    return found


def set_namespace_and_account(tmp_path: Path, namespace: str, account: str) -> Path:
    """A copy of manifests/rbac-trainjob with the two documented values edited."""
    copied = tmp_path / "rbac-trainjob"
    shutil.copytree(RBAC, copied)
    path = copied / "kustomization.yaml"
    text = path.read_text()
    assert text.count("namespace: kubeflow  # <-") == 1
    assert text.count("value: pipeline-runner  # <-") == 1
    path.write_text(text.replace("namespace: kubeflow  # <-", f"namespace: {namespace}  # <-")
                    .replace("value: pipeline-runner  # <-", f"value: {account}  # <-"))
    return copied


# ----------------------------------------------------------------------------- the tests
def test_defaults_bind_standalone_kfps_pipeline_runner_in_kubeflow():
    objects = by_kind(render(RBAC))
    assert set(objects) == {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert objects["Role"]["metadata"]["namespace"] == "kubeflow"
    assert objects["RoleBinding"]["metadata"]["namespace"] == "kubeflow"
    assert objects["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner"}]
    assert objects["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}]
    for obj in objects.values():
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/part-of": "batchscale"}


def test_the_namespace_and_service_account_reach_every_binding(tmp_path):
    objects = by_kind(render(set_namespace_and_account(tmp_path, "team-a", "bench-runner")))
    assert objects["Role"]["metadata"]["namespace"] == "team-a"
    assert objects["RoleBinding"]["metadata"]["namespace"] == "team-a"
    assert objects["RoleBinding"]["subjects"][0]["name"] == "bench-runner"
    assert objects["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "bench-runner", "namespace": "team-a"}]
    assert "namespace" not in objects["ClusterRole"]["metadata"]


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl (with its built-in kustomize) is not installed")
@pytest.mark.parametrize("values", [None, ("team-a", "bench-runner")])
def test_kubectl_kustomize_renders_the_same_objects(tmp_path, values):
    directory = set_namespace_and_account(tmp_path, *values) if values else RBAC
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert by_kind(list(yaml.safe_load_all(out))) == by_kind(render(directory))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", [None, ("team-a", "bench-runner")])
def test_rendered_manifests_pass_strict_schema_validation(tmp_path, values, version):
    directory = set_namespace_and_account(tmp_path, *values) if values else RBAC
    for obj in render(directory):
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    """The check above can fail: an unknown field (pruned by a real API server) is an error."""
    role = copy.deepcopy(by_kind(render(RBAC))["Role"])
    role["rules"][0]["verb"] = role["rules"][0].pop("verbs")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(role, KUBERNETES_VERSIONS[-1], strict=True)


def _rights(rules: list[dict]) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def test_full_kubeflow_already_grants_every_right_asked_for():
    """On multi-user Kubeflow nothing needs applying: each right of the Role is in Trainer's
    kubeflow-trainer-edit (aggregated into kubeflow-edit, bound to default-editor), and the
    ClusterRole's in the cluster-runtimes role every authenticated user has."""
    objects = by_kind(render(RBAC))
    for key, verbs in _rights(objects["Role"]["rules"]).items():
        assert verbs <= TRAINER_EDIT_RULES.get(key, set()), key
    for key, verbs in _rights(objects["ClusterRole"]["rules"]).items():
        assert verbs <= TRAINER_AUTHENTICATED_CLUSTER_RULES.get(key, set()), key


def test_every_manifest_is_reached_from_a_kustomization():
    """No stray YAML that `kubectl apply -k` would silently leave out."""
    listed = {RBAC / "kustomization.yaml", RBAC / "base" / "kustomization.yaml"}
    for directory in (RBAC, RBAC / "base"):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        listed |= {directory / r for r in kustomization.get("resources", [])}
    assert set(MANIFESTS.rglob("*.yaml")) <= listed
