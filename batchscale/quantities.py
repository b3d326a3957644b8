"""Kubernetes resource quantities as the pipeline's pods and the TrainJob's nodes both get them
(the same strings everywhere, as kubectl writes them)."""

import math


def mebibytes(gib: float) -> str:
    """A memory quantity in whole MiB (KFP accepts only integers before the unit)."""
    return f"{max(1, math.ceil(gib * 1024))}Mi"


def cpu_quantity(cpus: float) -> str:
    """A CPU quantity in whole CPUs where it is one, else in thousandths (millicores)."""
    millis = max(1, math.ceil(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
