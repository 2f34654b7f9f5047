"""Who decides what runs next: the scheduler actor.

- `scheduler`: the `Scheduler` (orchestrator) reads the log (published weight versions, the
  `samples` and `episodes` views, the trainer's readiness SQL in `stacx.train.units`) and emits
  `TaskScheduled` for the next iteration, the refills and the periodic eval groups, and says
  when the run is done. The launcher (`stacx.launch.launcher`) only builds its `Plan` and
  spawns it.
"""
