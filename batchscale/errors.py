"""Errors the user can act on. The CLI prints their message (no traceback) and exits non-zero."""


class BatchscaleError(Exception):
    """A problem the user can fix; `exit_code` is what the CLI returns."""

    exit_code = 1


class BadInput(BatchscaleError):
    """Invalid config, argument or file: nothing was started, nothing written (exit 2)."""

    exit_code = 2


class StoreError(BatchscaleError):
    """The object store refused or could not be reached."""

    exit_code = 2


class ObjectExists(StoreError):
    """A create-only write found different bytes already stored under the key."""


class ValidationFailed(BatchscaleError):
    """A table failed its great-expectations suite."""

    exit_code = 3
