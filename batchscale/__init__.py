"""batchscale: why a bigger batch does not train faster, and what to use instead."""

__version__ = "0.1.0"

from batchscale.contract import Workload  # noqa: E402  the public workload contract
from batchscale.loop import TrainingLoop  # noqa: E402  your own training loop

__all__ = ["TrainingLoop", "Workload", "__version__"]
