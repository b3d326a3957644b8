"""The critical batch over training and the batch-size schedule it suggests
(docs/batch-schedule.md): branches from checkpoints of one reference run measure B_crit(t)
(`measure`, fitted in `fit`), a step warm-up of the batch follows it (`plan`), and the schedule
is trained against the constant batch from the same seeds (`measure.run_check`)."""
