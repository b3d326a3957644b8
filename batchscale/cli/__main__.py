"""`python -m batchscale.cli`: the `batchscale` command, for images and tests that run it by
module."""

from batchscale.cli import entry

entry()
