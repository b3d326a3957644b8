"""A published table brought to `batchscale analyze`: one run per batch size, the paper's own
column names, no lr_rule. What the answer says when a choice cannot be made, how close the
runner-up came where no seeds give a spread, and messages that name the user's own column."""

from __future__ import annotations

import json

from batchscale import cli

BATCHES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
NOISE = (1.02, 0.97, 1.05, 0.99, 0.96, 1.03, 1.01, 0.98, 1.04)  # a published table's scatter


def paper_csv(path, times: bool = True, bad_row: str | None = None):
    lines = ["bs,steps_to_90" + (",secs" if times else "")]
    for batch, noise in zip(BATCHES, NOISE, strict=True):
        steps = round(3000 * (1 + 400 / batch) * noise)
        # step time 3.3 ms up to batch 32, then growing like sqrt(B): batch 16 and 32 tie
        secs = steps * 0.0033 * max(1.0, (batch / 32) ** 0.5)
        lines.append(f"{batch},{steps}" + (f",{secs:.3f}" if times else ""))
    if bad_row:
        lines[3] = bad_row
    path.write_text("\n".join(lines) + "\n")
    return path


def analyze(tmp_path, capsys, csv, *more: str):
    code = cli.main(["analyze", str(csv), "--column", "batch_size=bs", "--column",
                     "steps_to_target=steps_to_90", *more, "--bootstrap-samples", "50",
                     "--out", str(tmp_path / "out")])
    return code, capsys.readouterr()


def recommendation(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "summary.json").read_text())["summary"][
        "recommendation"]


def test_without_times_the_lr_rule_line_gives_its_own_reason(tmp_path, capsys):
    code, captured = analyze(tmp_path, capsys, paper_csv(tmp_path / "p.csv", times=False))
    assert code == 0, captured.err
    rec = recommendation(tmp_path)
    assert rec["batch_size"] is None and rec["lr_rule"] is None
    assert rec["lr_rule_reason"].startswith("the runs table gives no lr_rule")
    assert "LR rule: not given — the runs table gives no lr_rule" in captured.out
    # 3000 × (1 + 400/4096) × 1.04, thousands separated as elsewhere
    assert "(fewest steps: 3,425 at batch 4096)" in rec["batch_reason"]


def test_one_run_per_batch_names_how_close_the_next_fastest_came(tmp_path, capsys):
    code, captured = analyze(tmp_path, capsys, paper_csv(tmp_path / "p.csv"),
                             "--column", "time_to_target_s=secs")
    assert code == 0, captured.err
    reason = recommendation(tmp_path)["batch_reason"]
    assert ("one run at this batch, so no spread over seeds says how far the others are: the "
            "next fastest, batch") in reason
    ratio = float(reason.split("took ")[-1].split("×")[0])
    assert ratio >= 1.0


def test_a_bad_value_in_a_mapped_column_is_named_by_the_users_column(tmp_path, capsys):
    csv = paper_csv(tmp_path / "p.csv", times=False, bad_row="64,22k6")
    code, captured = analyze(tmp_path, capsys, csv)
    assert code == 2 and "Traceback" not in captured.err
    assert ("column 'steps_to_90' (read as 'steps_to_target' by --column "
            "steps_to_target=steps_to_90) holds '22k6'") in captured.err
    assert not (tmp_path / "out").exists()


def test_an_exact_tie_in_time_goes_to_the_fewer_steps(tmp_path, capsys):
    lines = ["bs,steps,secs", "16,1000,10.0", "32,500,10.0", "64,400,16.0"]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    code = cli.main(["analyze", str(tmp_path / "t.csv"), "--column", "batch_size=bs",
                     "--column", "steps_to_target=steps", "--column", "time_to_target_s=secs",
                     "--bootstrap-samples", "50", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    rec = recommendation(tmp_path)
    assert rec["batch_size"] == 32
    assert "the next fastest, batch 16, took 1.00× this time in 1,000 steps" in rec["batch_reason"]
