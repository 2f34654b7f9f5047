"""Who decides what runs next: the `Scheduler` (orchestrator), which reads the log and emits the
`TaskScheduled` of the next iterations, refills and periodic evals, and says when the run is done.
"""
