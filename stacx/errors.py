"""One base exception with clear subclasses. Inside the domain, failures become events; these
are for bad input and broken infrastructure at the edges; `strict` says whether our own bugs
crash at once (``STACX_STRICT``) rather than being retried."""

import os
import re


def strict() -> bool:
    """Whether ``STACX_STRICT`` is set (to anything but "" or "0"): programming errors crash."""
    return os.environ.get("STACX_STRICT", "") not in ("", "0")


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*(?:\x07|\x1b\\)")


def plain_text(text: str) -> str:
    """`text` without terminal escape sequences, as a stored message must be."""
    return _ANSI.sub("", text)


class StacxError(Exception):
    """Base of every STACX error; its message names the cause (the key path, the file, ...)."""


class ConfigError(StacxError):
    """A recipe or option is invalid: the message names the key path and the accepted values."""


class NotARunError(StacxError):
    """A path is not a STACX run directory."""


class PublishError(StacxError):
    """An event was not acknowledged by JetStream."""


class SandboxError(StacxError):
    """A sandbox could not be created or reached."""


class TaskError(StacxError):
    """A Harbor task is malformed or its image cannot be built."""


class ConfigCausedError(StacxError):
    """A failure the configuration causes, so another attempt would fail the same way: an episode
    ends with it once (InfraFailed, will_retry false)."""


class SandboxConfigError(SandboxError, ConfigCausedError):
    """A sandbox cannot be created as configured (e.g. an OCI runtime the engine lacks)."""


class BaseUnavailableError(TaskError, SandboxError, ConfigCausedError):
    """A task's base image cannot be had: no alias maps it, or its STACX base cannot be built."""


class EngineError(StacxError):
    """An inference backend failed."""
