"""Imitation learning (DAgger, AggreVaTe, on-policy distillation): roll-ins, branches, teacher.

A layer of its own, between the engines and `stacx.launch`: it composes engines (agents,
rollout, sandbox, inference, train), which no engine may do, and it never imports
`stacx.launch` or `stacx.cli` (the contracts in pyproject.toml).
"""
