"""What a Kubernetes API server with Kubeflow Trainer installed does with a TrainJob on CREATE,
as far as the tests need it, read from upstream and not from batchscale:

- the TrainJob CRD's openAPIV3Schema, pinned copies of kubeflow/trainer's
  manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml (tests/data/trainer/README.md says
  which release and commit; `test_pinned_crds_are_the_upstream_files` checks their git blob
  ids), checked the way the API server does: standard keywords with jsonschema, plus what only
  Kubernetes does (pruning of unknown fields, list-map keys, int32/int64 ranges, the CEL rules
  that apply on create);
- the Trainer's validating webhook for a torch runtime (v2.3.0
  pkg/runtime/framework/plugins/jobset/jobset.go and torch/torch.go `Validate`);
- the PET_* variables the Torch plugin gives the node container (torch.go `EnforceMLPolicy`).

Stand-ins for a real API server and Trainer, which cannot run here.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import re
from pathlib import Path

import yaml
from jsonschema import Draft4Validator

DATA = Path(__file__).parent / "data" / "trainer"
CURRENT = "v2.3.0"
# kubeflow/trainer `git ls-tree <tag> manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml`
CRD_BLOB_IDS = {"v2.3.0": "a5f2a17714acd92c11be743562498e83e20c25d1",
                "v2.1.0": "80195dc4c6fe5b3db2d248c35bb7410daa6180e5"}
# manifests/base/runtimes/torch_distributed.yaml of v2.3.0
RUNTIME_FILE = DATA / "torch_distributed-v2.3.0.yaml"

# apimachinery ObjectMeta fields a client may set on create; the API server handles metadata
# itself (a CRD's schema only says `type: object` there).
OBJECT_META_FIELDS = {"name", "generateName", "namespace", "labels", "annotations",
                      "ownerReferences", "finalizers"}
OWNER_REFERENCE_FIELDS = {"apiVersion", "kind", "name", "uid", "controller",
                          "blockOwnerDeletion"}
INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}
# The CEL rules of the schema that apply on CREATE, as Python. Rules with oldSelf are transition
# rules, evaluated only on update. Any other rule met on the way is reported, not skipped.
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
CEL_RULES = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
        lambda obj: DNS_LABEL.fullmatch(name_of(obj)) is not None,
    "size(self.metadata.name) <= 63": lambda obj: len(name_of(obj)) <= 63,
}
# kubeflow/trainer v2.3.0 pkg/constants/constants.go
TORCH_RESERVED_ENV = ["PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK",
                      "PET_NPROC_PER_NODE"]
ENVLESS_CONTAINERS = ("dataset-initializer", "model-initializer", "node")
WEBHOOK = "validator.trainjob.trainer.kubeflow.org"


def name_of(obj: dict) -> str:
    return obj.get("metadata", {}).get("name", "")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def crd_bytes(version: str) -> bytes:
    return gzip.decompress((DATA / f"trainjobs-{version}.yaml.gz").read_bytes())


@functools.cache
def trainjob_schema(version: str = CURRENT) -> dict:
    crd = yaml.load(crd_bytes(version), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return served["schema"]["openAPIV3Schema"]


@functools.cache
def validator(version: str = CURRENT) -> Draft4Validator:
    return Draft4Validator(trainjob_schema(version))


@functools.cache
def torch_distributed_runtime() -> dict:
    return yaml.safe_load(RUNTIME_FILE.read_text())


# ------------------------------------------------------------------------------ the schema
def schema_problems(obj: dict, version: str = CURRENT) -> list[str]:
    """Everything the API server would refuse or drop in `obj` on CREATE; empty when it keeps
    the object exactly as sent."""
    schema = trainjob_schema(version)
    problems = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in validator(version).iter_errors(obj)]
    problems += object_meta_problems(obj.get("metadata", {}))
    problems += walk({k: v for k, v in obj.items() if k != "metadata"}, schema, "", obj)
    return problems


def unknown_fields(obj: dict, version: str = CURRENT) -> list[str]:
    """The fields the API server would prune: what fieldValidation=Strict refuses."""
    return [p.split(":")[0] for p in schema_problems(obj, version) if "would prune" in p]


def object_meta_problems(meta: dict) -> list[str]:
    problems = [f"metadata.{k}: not an ObjectMeta field a client sets"
                for k in meta if k not in OBJECT_META_FIELDS]
    if not meta.get("name"):  # generateName would do, but the launcher names its jobs
        problems.append("metadata.name: required")
    for i, ref in enumerate(meta.get("ownerReferences", [])):
        problems += [f"metadata.ownerReferences[{i}].{k}: not an OwnerReference field"
                     for k in ref if k not in OWNER_REFERENCE_FIELDS]
        problems += [f"metadata.ownerReferences[{i}].{k}: required"
                     for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
    return problems


def walk(value, schema: dict, path: str, root: dict) -> list[str]:
    """Pruning, list types, integer formats and CEL rules, depth first."""
    problems = cel_problems(schema, path, root)
    if isinstance(value, dict):
        problems += object_problems(value, schema, path, root)
    elif isinstance(value, list):
        problems += list_problems(value, schema, path)
        for i, item in enumerate(value):
            problems += walk(item, schema.get("items", {}), f"{path}[{i}]", root)
    elif isinstance(value, int) and not isinstance(value, bool) and \
            schema.get("format") in INT_RANGES:
        low, high = INT_RANGES[schema["format"]]
        if not low <= value <= high:
            problems.append(f"{path}: {value} is outside {schema['format']}")
    return problems


def object_problems(value: dict, schema: dict, path: str, root: dict) -> list[str]:
    props, extra = schema.get("properties", {}), schema.get("additionalProperties")
    keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    problems = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key in props:
            problems += walk(item, props[key], where, root)
        elif isinstance(extra, dict):
            problems += walk(item, extra, where, root)
        elif not keep_unknown:
            problems.append(f"{where}: not in the CRD's schema; the API server would prune it "
                            "(fieldValidation=Strict refuses it)")
    return problems


def list_problems(value: list, schema: dict, path: str) -> list[str]:
    kind = schema.get("x-kubernetes-list-type")
    if kind == "map":
        keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"])
                for item in value]
    elif kind == "set":
        keys = [json.dumps(item, sort_keys=True) for item in value]
    else:
        return []
    duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
    return [f"{path}: duplicate entries {', '.join(duplicates)} in a list of type {kind}"] \
        if duplicates else []


def cel_problems(schema: dict, path: str, root: dict) -> list[str]:
    problems = []
    for validation in schema.get("x-kubernetes-validations", []):
        rule = validation["rule"]
        if "oldSelf" in rule:
            continue
        check = CEL_RULES.get(rule)
        if check is None:
            problems.append(f"{path or '(root)'}: CEL rule {rule!r} is not evaluated here")
        elif not check(root):
            problems.append(f"{path or '(root)'}: {validation.get('message', rule)}")
    return problems


# ------------------------------------------------------------------------------ the webhook
def domain_prefixed_path(value: str) -> bool:
    """apimachinery util/validation IsDomainPrefixedPath: a DNS-1123 subdomain, '/', an HTTP
    path."""
    host, _, rest = value.partition("/")
    subdomain = re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                             host)
    return bool(subdomain and len(host) <= 253 and
                re.fullmatch(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+", rest))


def runtime_containers(runtime: dict) -> dict[str, set[str]]:
    """Replicated job name -> its container and init container names."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return {job["name"]: {c["name"] for key in ("initContainers", "containers")
                          for c in job["template"]["spec"]["template"]["spec"].get(key, [])}
            for job in jobs}


def webhook_problems(job: dict, runtime: dict) -> list[str]:
    """What the Trainer's validating webhook (failurePolicy Fail) refuses on CREATE for a torch
    runtime: jobset.go `Validate` (runtime patches) and torch.go `Validate` (reserved envs)."""
    spec = job["spec"]
    problems = ["spec.initializer: not emulated by this stand-in"] if "initializer" in spec \
        else []
    containers = runtime_containers(runtime)
    for patch in spec.get("runtimePatches", []):
        if not domain_prefixed_path(patch.get("manager", "")):
            problems.append("spec.runtimePatches.manager: must be a domain-prefixed path "
                            '(such as "acme.io/foo")')
        template = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        for rjob in template.get("replicatedJobs", []):
            problems += replicated_job_problems(rjob, containers)
    env = [e["name"] for e in spec.get("trainer", {}).get("env", [])]
    reserved = sorted(set(env) & set(TORCH_RESERVED_ENV))
    if reserved:
        problems.append(f"spec.trainer.env: must not have reserved envs, invalid envs "
                        f"configured: {reserved}")
    return problems


def replicated_job_problems(rjob: dict, containers: dict[str, set[str]]) -> list[str]:
    name = rjob["name"]
    if name not in containers:
        return ["spec.runtimePatches: must not have replicated job that doesn't exist in the "
                "runtime job template"]
    pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec") or {}
    problems = [f"spec.runtimePatches: must not have initContainer that doesn't exist in the "
                f"runtime job {name}"
                for c in pod.get("initContainers", []) if c["name"] not in containers[name]]
    for c in pod.get("containers", []):
        if c["name"] not in containers[name]:
            problems.append(f"spec.runtimePatches: must not have container that doesn't exist "
                            f"in the runtime job {name}")
        elif c.get("env") and c["name"] in ENVLESS_CONTAINERS:
            problems.append("spec.runtimePatches: must not have envs for the "
                            "dataset-initializer, model-initializer, node containers")
    return problems


# ------------------------------------------------------------------------ the Torch plugin
def quantity_value(text) -> int:
    """resource.Quantity.Value() for plain and milli quantities: rounded up."""
    text = str(text)
    return math.ceil(float(text[:-1]) / 1000) if text.endswith("m") else math.ceil(float(text))


def node_resources(job: dict, runtime: dict) -> dict:
    trainer = job["spec"].get("trainer", {})
    if "resourcesPerNode" in trainer:
        return trainer["resourcesPerNode"]
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for c in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "node":
                return c.get("resources", {})
    return {}


def gpus_per_node(resources: dict) -> int:
    """runtime.GetNumGPUPerNode: the first resource whose name contains "gpu", requests first."""
    def count(resource_list: dict) -> int:
        return next((quantity_value(q) for n, q in resource_list.items() if "gpu" in n.lower()),
                    0)
    return count(resources.get("requests", {})) or count(resources.get("limits", {}))


def nproc_per_node(job: dict, runtime: dict) -> str:
    """PET_NPROC_PER_NODE as torch.go EnforceMLPolicy sets it: numProcPerNode, else "auto",
    which on CPU becomes the node's CPUs (at least 1) and with GPUs stays "auto"."""
    trainer = job["spec"].get("trainer", {})
    if "numProcPerNode" in trainer:
        return str(trainer["numProcPerNode"])
    resources = node_resources(job, runtime)
    if gpus_per_node(resources):
        return "auto"
    cpu = resources.get("requests", {}).get("cpu") or resources.get("limits", {}).get("cpu")
    return str(max(1, quantity_value(cpu) if cpu else 0))


def world_size(job: dict, runtime: dict) -> int:
    """Processes torchrun starts over all nodes; "auto" on a GPU node is one per GPU."""
    trainer = job["spec"].get("trainer", {})
    nodes = trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes", 1)
    nproc = nproc_per_node(job, runtime)
    per_node = gpus_per_node(node_resources(job, runtime)) if nproc == "auto" else int(nproc)
    return nodes * per_node
