"""`python -m batchscale.cli`: the `batchscale` command, for images and tests that run it by
module."""

import sys

from batchscale.cli import main

sys.exit(main())
