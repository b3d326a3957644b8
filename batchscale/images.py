"""The one setting every component takes its container image from.

Set BATCHSCALE_IMAGE / BATCHSCALE_GPU_IMAGE (or REGISTRY and TAG through `make compile`) before
compiling so the pipeline YAML points at the pushed tags. kfp.local ignores images.
"""

import os

from batchscale import __version__

CPU_IMAGE = os.environ.get("BATCHSCALE_IMAGE", f"ghcr.io/batchscale/batchscale-cpu:{__version__}")
GPU_IMAGE = os.environ.get("BATCHSCALE_GPU_IMAGE",
                           f"ghcr.io/batchscale/batchscale-cuda:{__version__}")
IMAGE_REF_ENV = "BATCHSCALE_IMAGE_REF"
"""The image reference a pipeline task runs, set on every task at compile time (a container
cannot see its own image) and recorded in every result row; pinned by digest
(`registry/name@sha256:...`) it names the image's content, not a tag that can be pushed again."""
