"""Imported last by the trial forkserver (sweep/isolation.py): one full garbage collection of
what its imports left. Trial processes forked from the server inherit the collector's state;
without this a full collection is already due in each of them, and it landed in their first
timed steps (a ~180 ms pause in a trial of ~120 one-millisecond steps: docs/sweep.md,
"Garbage-collection pauses"). Once per server instead of once per trial: the collection scans
the ~230,000 objects of torch's imports (about 85 ms)."""

import gc

gc.collect()
