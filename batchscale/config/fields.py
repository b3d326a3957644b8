"""Shared pieces of the config models: limits, constrained types, the strict base model and
the checks several sections use (`models.py`, `kubernetes.py`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from batchscale import names
from batchscale.errors import BadInput

DEFAULT_CONFIG_PATH = Path(__file__).parent.parent / "configs" / "default.yaml"

INT64_MAX = 2**63 - 1
"""Every integer ends up in an int64 column, a numpy array or a Kubernetes field."""
MAX_BATCH_SIZE = 2**31
"""Largest batch size (samples per step) accepted: beyond it torch's 32-bit index arithmetic
overflows in many kernels, and no device holds such a batch (2**31 8x8 float32 digits alone are
512 GiB)."""
MAX_SECONDS = 365 * 24 * 3600
"""Longest time limit or budget accepted, one year: a larger one is a typo, and Kubernetes
deadlines derived from it must stay within int64."""
MAX_SEED = 2**32 - 1
"""Seeds are 32-bit unsigned, as numpy's generators and torch accept them; the data order's
per-epoch seed (seed x 1,000,003 + epoch) then stays within int64."""
MAX_LEARNING_RATE = 1e6
"""Largest learning rate accepted (base or grid): scaled linearly up to MAX_BATCH_SIZE it stays
a finite float."""
MAX_SYNTHETIC_ROWS = 10_000_000
"""Most rows (training + validation) a synthetic dataset may have: data prep holds them all in
memory (~1.3 GB of features, several GB while labelling)."""
MAX_BOOTSTRAP_SAMPLES = 100_000
"""Most bootstrap resamples: the interval settles long before, and the cost grows linearly."""
MAX_K8S_ENTRIES = 64
"""Most node-selector labels or tolerations per list: a real node pool needs a handful."""
MAX_TEXT_CHARS = 4096
"""Longest text value (names, paths, URIs, labels) accepted anywhere in a config (PATH_MAX)."""

PositiveInt = Annotated[StrictInt, Field(gt=0, le=INT64_MAX)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]
BatchSize = Annotated[StrictInt, Field(gt=0, le=MAX_BATCH_SIZE)]
BatchSizes = Annotated[list[BatchSize], Field(min_length=1)]
Seconds = Annotated[float, Field(gt=0.0, le=MAX_SECONDS)]
LearningRate = Annotated[float, Field(gt=0.0, le=MAX_LEARNING_RATE)]
_BATCH_SIZES = TypeAdapter(BatchSizes)
MEMORY_SIZE_FORMS = ("a positive number of bytes, or a size with a unit such as 512MB or 2GiB "
                     "(KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: powers of 1024), "
                     "at most 2**63-1 bytes")
_MEMORY_SIZE_TEXT = re.compile(r"\s*(?:\d+|\d+\.\d+\s*(?=[kmgtp]))\s*"
                               r"(?:[kmgtp]i?b|b)?\s*", re.IGNORECASE)
"""A whole number of bytes, or a number with a unit (a fraction of a byte is a typo);
pydantic's own parser would take the first number of '1.0e+400' or '2GiB junk'."""


def _memory_size(value: object, handler: ValidatorFunctionWrapHandler) -> int:
    """pydantic's ByteSize, kept strict: no bools or floats (a fraction of a byte is a typo),
    text of the documented forms only, more than 0 bytes and at most INT64_MAX, stored as a
    plain int."""
    readable = isinstance(value, int) and not isinstance(value, bool) or (
        isinstance(value, str) and _MEMORY_SIZE_TEXT.fullmatch(value))
    try:
        size = handler(value) if readable else None
    except ValidationError:
        size = None
    if size is None or not 0 < size <= INT64_MAX:
        raise ValueError(f"expected {MEMORY_SIZE_FORMS}")
    return int(size)


MemorySize = Annotated[ByteSize, WrapValidator(_memory_size)]


def quote_value(value: object) -> str:
    """A value for a message: names.quote (short, credentials redacted, containers walked only
    so far), which also takes an int past Python's 4,300-digit limit for text."""
    try:
        return names.quote(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>"


class _Strict(BaseModel):
    # allow_inf_nan: every float of the config must be finite (an infinite time budget or
    # timeout overflowed later, e.g. in compile); str_max_length bounds every text value.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              allow_inf_nan=False, str_max_length=MAX_TEXT_CHARS)


def _checked(check, value, what: str):
    """Run one of batchscale.names' checks inside a pydantic validator (which needs a
    ValueError to name the field)."""
    try:
        return check(value, what)
    except BadInput as err:
        raise ValueError(str(err)) from None


_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _check_location(uri: str, what: str) -> None:
    """s3://bucket/prefix checked by batchscale.names (no credentials, a valid bucket, safe
    key parts); any other scheme is refused, a local path is left to its reader."""
    if uri.startswith("s3://"):
        _checked(names.split_s3_uri, uri, what)
    elif _URI_SCHEME.match(uri):
        raise ValueError(f"{quote_value(uri)} is neither a local path nor "
                         "s3://bucket/prefix")


def _sorted_unique(values: list[int]) -> list[int]:
    if len(set(values)) != len(values):
        raise ValueError(f"batch sizes must be distinct, got {quote_value(values)}")
    return sorted(values)
