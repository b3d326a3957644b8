"""The critical-batch fits: from the sweep, runs and curves tables to the analysis table, the
KFP metrics and the Markdown summary, and the figures the report shows of them. One concern per
module:

- `analyze`: `analyze(sweep, runs, curves, settings)` → rows, typed summary, metrics, Markdown
- `critical`: steps to result, S = S_min + E_min/B, B_crit (or a bound) and its interval,
  regimes
- `critical_summary`: per LR rule what is reported: a number, a bound or an edge case in words
- `timetotarget`: step times (convergence runs, sweep), time to target, B*, timing flags
- `quality`: measurement quality (unstable rows left out, conditions, what to do)
- `parallel`: the gradient noise scale B_simple, data-parallel efficiency, worker choice
- `recommend`: batch size, LR rule and workers, each with its reason
- `summary`: the typed summary (dataclasses) and its flat KFP metrics
- `narrative`: the Markdown prose, the one renderer of the narrative and the recommendation
- `plots`: matplotlib figures as base64 PNG `data:` URIs
- `usertables`: tables a user brings, checked and named (batchscale/external/ reads them)
- `stage`: the fits' entry (the analysis table); the analysis step's whole entry, with the plan
  and the report, is batchscale/report/stage.py

The sweep-table fits (throughput curve, saturation batch, t(B), memory) are in
`batchscale.fits`, shared with the sweep stage; the what-if planner is batchscale/planner/.
"""
