"""The environment engine: where tasks run (Docker, process and remote backends, the sandbox
service, egress, verification); the task format itself is stacx.harbor's. Imports nothing heavy:
import the module you use. Infrastructure failures are `InfraFailure`s, never a reward.

Design: docs/sandboxes.md#the-package-stacxsandbox
"""
