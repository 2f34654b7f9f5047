"""Connecting to NATS: bounded, quiet, authenticated from the environment ($STACX_NATS_*, never
recipes). The first connect returns or raises ``NatsUnreachable`` within a bounded time (refused
credentials or certificates at once); a connection once made reconnects forever; nats-py's
tracebacks are never printed. ``connect_waiting`` waits as long as it takes, until ``stop``.
Design: docs/sandboxes.md#remote-sandboxes-stacx-sandbox-serve
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import ssl
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client as NATS

from stacx.bus.auth import ENV_INBOX, inbox
from stacx.errors import ConfigError, StacxError

log = logging.getLogger(__name__)

ENV_CREDS = "STACX_NATS_CREDS"
ENV_USER = "STACX_NATS_USER"
ENV_PASSWORD = "STACX_NATS_PASSWORD"
ENV_CA = "STACX_NATS_CA"
ENV_CERT = "STACX_NATS_CERT"
ENV_KEY = "STACX_NATS_KEY"

CONNECT_TIMEOUT_S = 3.0
CONNECT_ATTEMPTS = 3  # per server, for the first connect only


class _QuietSslEof(logging.Filter):
    """asyncio warns on every TLS connection nats-py closes ("returning true from
    eof_received() has no effect when using ssl"): noise to an operator, dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietSslEof())


class NatsUnreachable(StacxError):
    """No server of the URL could be connected to (the message names the URL and the cause)."""


class NatsAuthError(NatsUnreachable):
    """A server refused the credentials (or their absence)."""


def _split(url: str) -> list[str]:
    return [u.strip() for u in url.split(",") if u.strip()]


def _file_env(name: str) -> str | None:
    value = os.environ.get(name) or None
    if value is not None and not os.path.isfile(value):
        raise ConfigError(f"${name}={value!r}: no such file")
    return value


def auth_options(url: str) -> dict[str, Any]:
    """nats-py connect options for the credentials and TLS settings of the environment."""
    opts: dict[str, Any] = {}
    creds = _file_env(ENV_CREDS)
    if creds:
        opts["user_credentials"] = creds
    user, password = os.environ.get(ENV_USER), os.environ.get(ENV_PASSWORD)
    if user:
        if creds:
            raise ConfigError(f"${ENV_CREDS} and ${ENV_USER} are both set: use one way to log in")
        opts["user"], opts["password"] = user, password or ""
    ca, cert, key = _file_env(ENV_CA), _file_env(ENV_CERT), _file_env(ENV_KEY)
    if bool(cert) != bool(key):
        raise ConfigError(
            f"${ENV_CERT} and ${ENV_KEY} go together (a client certificate and its key)"
        )
    if ca or cert or any(u.startswith("tls://") for u in _split(url)):
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert and key:
            ctx.load_cert_chain(cert, key)
        opts["tls"] = ctx
    return opts


def redact(url: str) -> str:
    """`url` with any password replaced by ***, for messages and logs."""
    return re.sub(r"(://[^:/@,]+):[^@/,]*@", r"\1:***@", url)


def inbox_prefix(url: str, opts: dict[str, Any]) -> str:
    """$STACX_NATS_INBOX, else `_INBOX_<user>` when logging in as a user (the URL's or
    $STACX_NATS_USER), else nats-py's default `_INBOX`."""
    if os.environ.get(ENV_INBOX):
        return os.environ[ENV_INBOX]
    user = opts.get("user") or urlsplit(_split(url)[0]).username
    return inbox(user) if user else "_INBOX"


def _is_auth(exc: BaseException | None) -> bool:
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text


def _describe(url: str, exc: BaseException | None) -> str:
    url = redact(url)
    if exc is None:
        return f"NATS at {url}: no server answered"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return f"NATS at {url}: TLS failed ({exc}); set ${ENV_CA} to the CA that signed its certificate"
    if _is_auth(exc):
        how = f"${ENV_CREDS}, or ${ENV_USER} and ${ENV_PASSWORD}"
        return f"NATS at {url} refused the credentials ({exc or type(exc).__name__}): check {how}"
    reason = str(exc) or type(exc).__name__
    if "permissions violation" in reason.lower():
        return f"NATS at {url} refused by this user's subject permissions: {reason}"
    return f"cannot reach NATS at {url}: {reason}"


class _Callbacks:
    """Quiet callbacks: the first connect's errors are kept (its caller reports the last);
    a live connection's are logged once per distinct message."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = redact(url), name
        self.connected = False
        self.nc: NATS | None = None
        self.last: BaseException | None = None
        self.auth: BaseException | None = None  # a refusal of the credentials, if one came
        self.fatal = asyncio.Event()  # the first connect cannot succeed (credentials, TLS)
        self._logged = ""

    async def error(self, exc: Exception) -> None:
        self.last = exc
        if not self.connected:
            if _is_auth(exc):
                self.auth = exc
            if _is_auth(exc) or isinstance(exc, ssl.SSLError | ssl.CertificateError):
                self.fatal.set()
            return
        text = _describe(self.url, exc)
        if text != self._logged:
            self._logged = text
            log.warning("%s: %s", self.name, text)

    async def disconnected(self) -> None:
        nc = self.nc
        if self.connected and nc is not None and not (nc.is_closed or nc.is_draining):
            log.warning("%s: disconnected from NATS at %s; reconnecting", self.name, self.url)

    async def reconnected(self) -> None:
        self._logged = ""
        log.warning("%s: reconnected to NATS at %s", self.name, self.url)


async def connect(
    url: str,
    *,
    name: str = "stacx",
    attempts: int = CONNECT_ATTEMPTS,
    timeout_s: float = CONNECT_TIMEOUT_S,
    ceiling_s: float = 120.0,
) -> NATS:
    """Connect to `url` (comma-separated servers) within about ``attempts x servers x (timeout
    + 0.2 s)`` (``ceiling_s`` at most), or raise NatsUnreachable (NatsAuthError: refused)."""
    servers = _split(url)
    if not servers:
        raise ConfigError("NATS URL is empty (pass --url or set STACX_NATS_URL)")
    cb = _Callbacks(url, name)
    nc = cb.nc = NATS()
    opts = auth_options(url)
    connecting = asyncio.create_task(
        nc.connect(
            servers=servers,
            name=name,
            connect_timeout=timeout_s,  # type: ignore[arg-type]  # a float works
            max_reconnect_attempts=max(1, attempts - 1),  # 0 would mean "forever"
            reconnect_time_wait=0.2,  # type: ignore[arg-type]
            pending_size=64 * 1024 * 1024,
            allow_reconnect=True,
            error_cb=cb.error,
            disconnected_cb=cb.disconnected,
            reconnected_cb=cb.reconnected,
            inbox_prefix=inbox_prefix(url, opts),
            **opts,
        )
    )
    # A refused credential or certificate is final: stop at once (nats-py would retry, and
    # after a failed TLS handshake it can hang closing the transport).
    fatal = asyncio.create_task(cb.fatal.wait())
    try:
        await asyncio.wait(
            {connecting, fatal}, timeout=ceiling_s, return_when=asyncio.FIRST_COMPLETED
        )
    except BaseException:  # the caller was cancelled (a signal): no connect left behind
        connecting.cancel()
        raise
    finally:
        fatal.cancel()
    failure = None if not connecting.done() else connecting.exception()
    if not connecting.done() or failure is not None:
        connecting.cancel()
        cause = (
            cb.auth or cb.last or failure or TimeoutError(f"no connection within {ceiling_s:g}s")
        )
        raise await _failed(nc, url, cause)
    cb.connected = True
    nc.options["max_reconnect_attempts"] = -1  # connected: from now on reconnect forever
    return nc


async def _failed(nc: NATS, url: str, cause: BaseException) -> NatsUnreachable:
    """The error of a first connect that failed with `cause`, once `nc` is closed."""
    if (
        not _is_auth(cause)
        and (nc._server_info or {}).get("auth_required")
        and isinstance(cause, ConnectionError | EOFError | nats.errors.UnexpectedEOF)
    ):
        # it asked for a login and hung up after ours: a refusal whose -ERR was not read
        cause = nats.errors.AuthorizationError()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(nc.close(), 2.0)
    kind = NatsAuthError if _is_auth(cause) else NatsUnreachable
    return kind(_describe(url, cause))


async def connect_waiting(
    url: str, stop: asyncio.Event, *, name: str = "stacx", max_wait_s: float = 10.0
) -> NATS | None:
    """Connect, however long the server takes: says once that it waits, retries quietly (backoff
    up to `max_wait_s`), returns None once `stop` is set; refused credentials raise."""
    wait, said = 0.5, False
    while not stop.is_set():
        try:
            return await connect(url, name=name, attempts=1)
        except NatsAuthError:
            raise
        except NatsUnreachable as exc:
            if not said:
                log.warning(
                    "%s; waiting for it (retrying quietly until it answers or a signal)", exc
                )
                said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        wait = min(wait * 2, max_wait_s)
    return None
