"""batchscale: why a bigger batch does not train faster, and what to use instead."""

__version__ = "0.1.0"
