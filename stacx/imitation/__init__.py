"""Imitation learning (DAgger, AggreVaTe, on-policy distillation): roll-ins, branches, teacher. A
layer of its own between the engines and `stacx.launch`: it composes engines, which no engine may
do, and never imports `stacx.launch` or `stacx.cli`.
Design: docs/training.md#imitation-roll-ins-teacher-signals-branches
"""
