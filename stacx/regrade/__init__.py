"""Regrading recorded episodes (`stacx regrade RUN`): replay an episode's recorded actions in a
fresh sandbox, grade the final state with a new grader, record the grade in the run's log.

- graders  the `Grader` port (a name per task, a verdict per replayed episode), the verifier
           grader, and the extension point for a judge
- replay   recorded tool calls out of an episode's events, run again, divergence detection
- driver   the regrade itself: selection, tasks, sandboxes on the run's backend, events
"""
