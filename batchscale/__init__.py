"""batchscale: why a bigger batch does not train faster, and what to use instead."""

__version__ = "0.1.0"

from batchscale.contract import Workload  # noqa: E402  the public workload contract

__all__ = ["Workload", "__version__"]
