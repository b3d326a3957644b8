"""What several `batchscale` commands share: the local state directory, run ids, the object
store connection, the help text of the flags they have in common, and Markdown made readable on
a terminal."""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import sys
from pathlib import Path

from batchscale.errors import BadInput
from batchscale.names import check_run_id

STATE_DIR = Path(".batchscale")

CONFIG_HELP = "experiment YAML (default: the embedded digits config, `batchscale config show`)"
CONFIG_FLAGS_NOTE = ("Flags named after a config field (--time-budget-s for sweep.time_budget_s) "
                     "replace that field's value in --config; see docs/config.md.")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)


def given_run_id(args) -> str:
    """--run-id checked (it names directories and lake partitions: one safe path segment), or a
    new one when the flag is absent (an empty one is refused, not replaced)."""
    return new_run_id() if args.run_id is None else check_run_id(args.run_id)


def connect_store():
    """The configured S3 store, or the local SeaweedFS (started if needed) when
    BATCHSCALE_S3_ENDPOINT is unset. Checks that it answers before any work starts."""
    from batchscale import localstore
    from batchscale.storage import ObjectStore, S3Settings, env_prefix

    if not os.environ.get("BATCHSCALE_S3_ENDPOINT"):
        prefix = env_prefix()  # a bad BATCHSCALE_S3_PREFIX is refused before the store starts
        info = localstore.up()
        settings = info.settings(prefix)
        # The pipeline's tasks are subprocesses: they find the store through the environment.
        os.environ.update({
            "BATCHSCALE_S3_ENDPOINT": info.endpoint_url, "BATCHSCALE_S3_BUCKET": info.bucket,
            "BATCHSCALE_S3_PREFIX": settings.prefix, "AWS_ACCESS_KEY_ID": info.access_key,
            "AWS_SECRET_ACCESS_KEY": info.secret_key,
        })
        print(f"store: local SeaweedFS at {info.endpoint_url} (pid {info.pid})", file=sys.stderr)
    store = ObjectStore(S3Settings.from_env())
    store.check()
    return store


def terminal_text(markdown: str) -> str:
    """Markdown as a terminal shows it well: headings underlined, bold and code marks dropped
    (the words stay; the HTML report keeps the formatting)."""
    lines = []
    for line in markdown.splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if heading:
            title = heading.group(1)
            lines += [title, "-" * len(title)]
            continue
        lines.append(re.sub(r"\*\*(.+?)\*\*", r"\1", line).replace("`", ""))
    return "\n".join(lines)


def refuse_analyze_run_id(run_id: str, written: str) -> None:
    """`batchscale analyze` writes `written` (and its other outputs) to its --out folder, never
    to the lake: its run ids are refused before a store is started to look for them."""
    from batchscale.external.stage import RUN_ID_PREFIX

    if run_id.startswith(RUN_ID_PREFIX):
        raise BadInput(f"run id {run_id!r} is `batchscale analyze`'s (ids starting "
                       f"{RUN_ID_PREFIX!r}): analyze writes to its --out folder, not the lake, "
                       f"so what you ask for is {written} there (by default .batchscale/"
                       f"analyze/{run_id}/{written}); this command reads runs and studies "
                       "published by `run` and `study`")
