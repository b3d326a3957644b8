"""The one setting every component takes its container image from.

Set BATCHSCALE_IMAGE / BATCHSCALE_GPU_IMAGE (or REGISTRY and TAG through `make compile`) before
compiling so the pipeline YAML points at the pushed tags. kfp.local ignores images.
"""

import os

from batchscale import __version__

CPU_IMAGE = os.environ.get("BATCHSCALE_IMAGE", f"ghcr.io/batchscale/batchscale-cpu:{__version__}")
GPU_IMAGE = os.environ.get("BATCHSCALE_GPU_IMAGE",
                           f"ghcr.io/batchscale/batchscale-cuda:{__version__}")
