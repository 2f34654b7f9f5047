"""Regrading recorded episodes (`stacx regrade RUN`): replay an episode's recorded actions in a
fresh sandbox (`replay`), grade the final state with a new grader (`graders`, `judging`), record the
grade in the run's log (`driver`).
"""
