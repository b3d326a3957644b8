"""Studies: one experiment fanned out over variants (config `study:`), each variant a whole
pipeline run, compared in one report and stored in the lake (docs/architecture.md, "Studies").
Not the adaptive search of one run (batchscale/adaptive/)."""
