"""One base exception with clear subclasses. Inside the domain, failures become events; these
are for bad input and broken infrastructure at the edges."""


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


class EngineError(StacxError):
    """An inference backend failed."""
