"""The environment engine: where Harbor tasks run. Backends (Docker, process, remote), the
sandbox service, networking (egress, the allowlist proxy) and verification; the task format
itself (task.toml, task sets, compose files) is read by stacx.harbor.

This package imports nothing heavy: import the module you use. An episode's sandbox is entered,
used and verified through the `Environments` port; infrastructure failures are `InfraFailure`s,
never a reward.

Specification: docs/sandboxes.md#the-package-stacxsandbox
"""
