"""A corpus of hostile inputs through the real `batchscale` command, one class of bad input per
row of docs/reliability.md's tally: each must end with its documented exit status and a message
naming the problem (no traceback, no silent acceptance), within its wait bound.

`python tests/test_hostile_inputs.py` runs the corpus and prints the tally by class (what
docs/reliability.md quotes). The cases run real processes with nothing stood in; the network
cases use local ports nothing listens on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import run_cli

TESTS_DIR = Path(__file__).parent
WAIT_BOUND_S = 60
"""Every case must end within this (the slowest stated bound below it: the S3 check's ~21 s)."""
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing listens on it here
ALIAS_BOMB = "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
                     for p, n in zip("abcd", "bcde", strict=True))


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    argv: list[str]
    exit: int
    says: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    in_tests_dir: bool = False  # run where tests/contract_workloads.py can be imported


def _compile(config: str) -> list[str]:
    return ["compile", "--config", config, "--output", "pipeline.yaml"]


CASES = [
    Case("config", "unknown key", _compile("c.yaml"), 2, "sweep.batch_sizez: unknown key",
         {"c.yaml": "sweep:\n  batch_sizez: [1]\n"}),
    Case("config", "wrong type", _compile("c.yaml"), 2,
         "sweep.batch_sizes: expected a list of positive integers", {"c.yaml": "sweep:\n  "
                                                                     "batch_sizes: many\n"}),
    Case("config", "negative batch size", _compile("c.yaml"), 2,
         "convergence.batch_sizes.0: Input should be greater than 0",
         {"c.yaml": "convergence:\n  batch_sizes: [-4, 8]\n"}),
    Case("config", "repeated key", _compile("c.yaml"), 2, "repeats the key 'name'",
         {"c.yaml": "name: a\nname: b\n"}),
    Case("config", "alias bomb", _compile("c.yaml"), 2, "expands to more than 10000 YAML nodes",
         {"c.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + ALIAS_BOMB}),
    Case("config", "not UTF-8", _compile("c.yaml"), 2, "is not UTF-8 text: byte 0xff",
         {"c.yaml": b"name: \xff\xfe\n"}),
    Case("config", "a FIFO given as the config", _compile("fifo"), 2,
         "is a FIFO (named pipe), not a regular file"),
    Case("config", "an infinite number", _compile("c.yaml"), 2,
         "sweep.time_budget_s: Input should be a finite number",
         {"c.yaml": "sweep:\n  time_budget_s: .inf\n"}),
    Case("config", "an empty config (accepted, and said)", _compile("c.yaml"), 0,
         "sets nothing (empty, or only comments): every setting is its default",
         {"c.yaml": "# nothing but a comment\n"}),
    Case("workload", "a standard-library callable", _compile("c.yaml"), 2,
         "'os' is part of Python's standard library", {"c.yaml": 'workload: "os:system"\n'}),
    Case("workload", "an unknown name", _compile("c.yaml"), 2,
         "unknown workload 'resnet19' (did you mean 'resnet18'?); allowed:",
         {"c.yaml": "workload: resnet19\n"}),
    Case("workload", "an unimportable module",
         ["sweep", "--workload", "nosuchpkg.mod:build", "--batch-sizes", "4", "--out", "s.pq"],
         2, "cannot import module 'nosuchpkg.mod'"),
    Case("workload", "a model that rejects its batches",
         ["converge", "--workload", "contract_workloads:wrong_input", "--batch-sizes", "4",
          "--out", "{tmp}/c"], 2, "Workload.loss failed on a batch of 2 training examples",
         in_tests_dir=True),
    Case("workload", "a loss that is not finite",
         ["converge", "--workload", "contract_workloads:nan_loss", "--batch-sizes", "4",
          "--out", "{tmp}/c"], 2, "expected a finite value", in_tests_dir=True),
    Case("workload", "a dataset smaller than one global batch",
         ["converge", "--workload", "contract_workloads:tiny_data", "--batch-sizes", "4,16",
          "--out", "{tmp}/c"], 2, "fewer than the largest global batch 16", in_tests_dir=True),
    Case("cli", "an empty list item", ["sweep", "--batch-sizes", "1", "", "2", "--out", "s.pq"],
         2, "has an empty value"),
    Case("cli", "an abbreviated flag", ["converge", "--batch-size", "4", "--out", "x"], 2,
         "did you mean --batch-sizes?"),
    Case("cli", "non-ASCII digits", ["sweep", "--batch-sizes", "١٢", "--out", "s.pq"], 2,
         "is not an integer (digits 0-9)"),
    Case("cli", "an integer beyond int64", ["sweep", "--batch-sizes", "9" * 40, "--out", "s.pq"],
         2, "at most 2**63-1"),
    Case("cli", "path traversal in a run id",
         ["converge", "--run-id", "../../x", "--batch-sizes", "4", "--out", "c"], 2,
         "run id '../../x' is not allowed"),
    Case("cli", "an output path that is a directory",
         ["sweep", "--batch-sizes", "4", "--out", "."], 2, "is a directory"),
    Case("cli", "a cron day that never comes",
         ["schedule", "--host", NOBODY, "--cron", "0 0 0 31 2 *"], 2, "never runs"),
    Case("file", "text given as Parquet", ["validate", "--table", "sweep", "t.parquet"], 2,
         "t.parquet", {"t.parquet": "this is not parquet\n"}),
    Case("file", "an empty Parquet file", ["validate", "--table", "sweep", "e.parquet"], 2,
         "e.parquet", {"e.parquet": b""}),
    Case("table", "a runs table without steps to target",
         ["analyze", "r.csv", "--out", "an"], 2, "lacks steps_to_target or examples_to_target",
         {"r.csv": "batch_size,seed\n8,0\n16,0\n"}),
    Case("table", "a negative batch size in a runs table",
         ["analyze", "r.csv", "--out", "an"], 2, "column 'batch_size' is not positive (-16)",
         {"r.csv": "batch_size,steps_to_target\n8,100\n-16,50\n"}),
    Case("network", "an S3 endpoint nothing answers", ["report", "--run-id", "x1"], 2,
         f"cannot reach S3 endpoint {NOBODY}",
         env={"BATCHSCALE_S3_ENDPOINT": NOBODY, "AWS_ACCESS_KEY_ID": "a",
              "AWS_SECRET_ACCESS_KEY": "b"}),
    Case("network", "credentials in the endpoint URL", ["report", "--run-id", "x1"], 2,
         "carries credentials", env={"BATCHSCALE_S3_ENDPOINT": "http://u:hunter2@127.0.0.1:9"}),
    Case("network", "a bucket name S3 refuses", ["report", "--run-id", "x1"], 2,
         "is not a valid S3 bucket name",
         env={"BATCHSCALE_S3_ENDPOINT": NOBODY, "BATCHSCALE_S3_BUCKET": "Bad_Bucket!"}),
    Case("network", "a KFP host nothing answers", ["submit", "--host", NOBODY], 1,
         f"cannot reach the KFP API at {NOBODY}"),
]


def run_case(case: Case, tmp: Path) -> tuple[int, str, float]:
    """(exit status, stdout + stderr, seconds) of one case in its own directory `tmp`."""
    for name, body in case.files.items():
        path = tmp / name
        path.write_bytes(body) if isinstance(body, bytes) else path.write_text(body)
    if "fifo" in case.argv:
        os.mkfifo(tmp / "fifo")
    argv = [arg.replace("{tmp}", str(tmp)) for arg in case.argv]
    started = time.perf_counter()
    result = run_cli(argv, cwd=TESTS_DIR if case.in_tests_dir else tmp, env=case.env,
                     timeout_s=WAIT_BOUND_S)
    return result.returncode, result.stdout + result.stderr, time.perf_counter() - started


@pytest.mark.parametrize("case", CASES, ids=[f"{c.kind}-{c.name}" for c in CASES])
def test_a_hostile_input_ends_with_its_status_and_message(case, tmp_path):
    code, output, _ = run_case(case, tmp_path)
    assert "Traceback" not in output, output[-3000:]
    assert code == case.exit, output[-3000:]
    assert case.says in output, output[-3000:]
    assert "hunter2" not in output


def tally() -> None:
    """Run the corpus and print, per kind of input, cases / right status and message /
    tracebacks / silent acceptances / slowest seconds."""
    import tempfile

    rows: dict[str, list] = {}
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            code, output, seconds = run_case(case, Path(tmp))
        right = code == case.exit and case.says in output
        silent = code == 0 and case.exit != 0
        rows.setdefault(case.kind, []).append((right, "Traceback" in output, silent, seconds))
    print("| kind | cases | right status and message | tracebacks | silent acceptances | "
          "slowest (s) |\n|---|---|---|---|---|---|")
    for kind, found in rows.items():
        print(f"| {kind} | {len(found)} | {sum(r[0] for r in found)} | "
              f"{sum(r[1] for r in found)} | {sum(r[2] for r in found)} | "
              f"{max(r[3] for r in found):.1f} |")


if __name__ == "__main__":
    tally()
