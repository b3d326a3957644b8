"""The report: one assembler (`render.render_html`) that takes each capability's section — the
critical-batch analysis, the what-if plan (planner), the adaptive search, the batch schedule,
the regressions — and the analysis step's entry (`stage`), which runs the fits, the plan and
the render. Publish and `batchscale report` render through the same assembler
(lake/summary.py `assemble_report`)."""
