"""The client's view of the sandbox services: live hosts from their adverts, placement by free
slots, and host-lost detection (`Host.lost`, set when a host's adverts stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from stacx.errors import SandboxError
from stacx.sandbox.remote_wire import ADVERT, ADVERT_DECODER, DISCOVER, Advert

log = logging.getLogger(__name__)
# A host is lost after `lost_after` heartbeats without an advert, and never sooner than this:
# a loaded machine delays a beat by a second now and then.
MIN_LOST_AFTER_S = 3.0


class Host:
    """A live service as the client sees it: its last advert and whether it is lost."""

    def __init__(self, advert: Advert) -> None:
        self.advert = advert
        self.seen = time.monotonic()
        self.lost = asyncio.Event()
        self.why = ""
        self.placing = 0  # starts sent, not yet answered (not in its advert yet)

    @property
    def free(self) -> int:
        return self.advert.slots - self.advert.used - self.placing

    def mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("sandbox service %s lost: %s", self.advert.service_id, why)
            self.why = why
            self.lost.set()


class HostTable:
    """The live services, from their adverts; `pick` places a sandbox by free slots."""

    def __init__(self, nc: NATS, *, lost_after: float = 5.0) -> None:
        self.nc = nc
        self.lost_after = lost_after  # heartbeats without an advert before a host is lost
        self.hosts: dict[str, Host] = {}
        self.changed = asyncio.Event()
        self._sub: object = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(ADVERT, cb=self._on_advert)
        self._watch = asyncio.create_task(self._watchdog())
        for advert in await discover(self.nc, wait=0.3):
            self._see(advert)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()  # type: ignore[attr-defined]

    async def _on_advert(self, msg: Msg) -> None:
        self._see(ADVERT_DECODER.decode(msg.data))

    def _see(self, advert: Advert) -> None:
        host = self.hosts.get(advert.service_id)
        if host is None or host.lost.is_set():  # new, or back after being lost: a fresh entry
            self.hosts[advert.service_id] = host = Host(advert)
        host.advert, host.seen = advert, time.monotonic()
        self.changed.set()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for host in self.hosts.values():
                silent = now - host.seen
                if silent > max(self.lost_after * host.advert.heartbeat_s, MIN_LOST_AFTER_S):
                    host.mark_lost(f"no heartbeat for {silent:.1f}s")

    def live(self) -> list[Host]:
        return [h for h in self.hosts.values() if not h.lost.is_set()]

    async def pick(self, digest: str, *, wait: float) -> Host:
        """The live host with most free slots (having built `digest` wins ties), within `wait` s."""
        deadline = time.monotonic() + wait
        while True:
            free = [h for h in self.live() if h.free > 0]
            if free:
                return max(free, key=lambda h: (h.free, digest in h.advert.tasks))
            left = deadline - time.monotonic()
            if left <= 0:
                live = self.live()
                raise SandboxError(
                    "no sandbox service with a free slot"
                    + (f" ({len(live)} live, all full)" if live else " (none is live)")
                )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))


async def discover(nc: NATS, *, wait: float = 1.0) -> list[Advert]:
    """Every live service's advert (a scatter-gather request on `stacx.sandbox.discover`)."""
    inbox = nc.new_inbox()
    found: dict[str, Advert] = {}

    async def got(msg: Msg) -> None:
        if msg.data:  # not the server's "no responders" status (no service is up)
            advert = ADVERT_DECODER.decode(msg.data)
            found[advert.service_id] = advert

    sub = await nc.subscribe(inbox, cb=got)
    await nc.publish(DISCOVER, b"", reply=inbox)
    await nc.flush()
    await asyncio.sleep(wait)
    await sub.unsubscribe()
    return sorted(found.values(), key=lambda a: a.service_id)
