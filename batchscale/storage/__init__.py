"""Storage, one package: objects in S3 (`s3.py`: create-only, checksummed, bounded waits) and
local files (`files.py`: the one atomic writer, safe Parquet reads). Import from here.
"""

from batchscale.storage.files import (
    atomic_file,
    parquet_bytes,
    read_table_file,
    write_bytes_atomic,
    write_table_atomic,
)
from batchscale.storage.s3 import (
    PREFLIGHT_WAITS,
    TRANSFER_WAITS,
    ObjectStore,
    S3Settings,
    Waits,
    env_prefix,
    sha256_b64,
)

__all__ = [
    "PREFLIGHT_WAITS",
    "TRANSFER_WAITS",
    "ObjectStore",
    "S3Settings",
    "Waits",
    "atomic_file",
    "env_prefix",
    "parquet_bytes",
    "read_table_file",
    "sha256_b64",
    "write_bytes_atomic",
    "write_table_atomic",
]
