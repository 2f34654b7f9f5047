"""Weight sync: :class:`WeightSync`, one actor per engine, loads each ``WeightsPublished`` version
by the cheapest transport that reaches it (memory, shared, file) and publishes ``WeightsLoaded``.
Versions only move forward; a restarted engine catches up to the newest; a file whose sha256 does
not match is an error, never a silent load. Design: docs/engine.md#weight-sync
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from stacx.actors.base import Actor
from stacx.errors import EngineError, StacxError
from stacx.events import CheckpointSaved, Event, WeightsLoaded, WeightsPublished, derive_id
from stacx.inference import adapters
from stacx.inference.sglang_client import StateNotAccepted
from stacx.ports import Engine, LoadsAdapter, LoadsState
from stacx.train.checkpoint import sha256_file

if TYPE_CHECKING:
    import torch

    from stacx.weights.share import SharedWeights

log = logging.getLogger(__name__)


class InProcessWeights:
    """The in-process handoff: `WeightOffer` for the trainer, `take` for WeightSync; newest only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offered: tuple[str, str, Mapping[str, torch.Tensor]] | None = None

    def offer(self, path: str, sha256: str, state: Mapping[str, torch.Tensor]) -> None:
        """Make ``state`` (a snapshot the caller will not modify) the copy of ``path``."""
        with self._lock:
            self._offered = (path, sha256, state)

    def take(self, path: str, sha256: str) -> Mapping[str, torch.Tensor] | None:
        """The in-memory copy of ``path`` if one was offered with this digest."""
        with self._lock:
            hit = self._offered
        return hit[2] if hit is not None and hit[:2] == (path, sha256) else None


class WeightSync(Actor):
    """Loads published weights into one engine. Construct with the engine (and the process's
    `InProcessWeights`, if the trainer shares this process), then spawn."""

    name: ClassVar[str] = "weight-sync"
    kinds: ClassVar[tuple[type[Event], ...]] = (WeightsPublished, CheckpointSaved)
    max_inflight: ClassVar[int] = 1

    def __init__(
        self,
        engine: Engine,
        *,
        label: str | None = None,
        verify: bool = True,
        handoff: InProcessWeights | SharedWeights | None = None,
    ) -> None:
        self.engine = engine
        self.handoff = handoff
        self.label = label or engine.name
        self.verify = verify
        # one durable consumer per engine: two engines must each see every WeightsPublished
        self.name = f"weight-sync-{self.label}"  # type: ignore[misc]

    async def on_start(self) -> None:
        try:
            await self._catch_up(None)
        except StacxError as e:
            # not fatal here: its WeightsPublished is redelivered to handle(), whose retries
            # end in an InfraFailed; crashing would only restart this actor in a loop
            log.warning("%s: catching up failed: %s", self.name, e)

    async def handle(self, event: Event) -> None:
        if isinstance(event, WeightsPublished | CheckpointSaved):
            await self._catch_up(event.version)

    async def _catch_up(self, seen: int | None) -> None:
        """Load the newest version this engine can reach: the newest published (memory, or its
        file once durable), else the newest durable one. ``seen``: the version of the event
        being handled (the log holds it)."""
        for sql in (_NEWEST_PUBLISHED, NEWEST_DURABLE_SQL):
            rows = (await self.query(sql)).to_pylist()
            if not rows:
                continue
            r = rows[0]
            if int(r["version"]) <= self.engine.weight_version:
                return  # nothing newer to reach
            target = WeightsPublished(
                run_id=self.run_id,
                version=int(r["version"]),
                path=str(r["path"]),
                sha256=str(r["sha256"]),
                step=int(r["version"]),
                ts=float(r["ts"]),
                durable=bool(r["durable"]),
            )
            if await self._load(target):
                return
        log.info(
            "%s: v%s is not durable and not in memory here; staying at v%d",
            self.name,
            seen,
            self.engine.weight_version,
        )

    async def _load(self, event: WeightsPublished) -> bool:
        """Load ``event``'s version; False when it is not durable and not in memory here."""
        start = time.perf_counter()
        transport = "file"
        lora = adapters.adapter_dir(event.path)  # a LoRA version: the adapter only moves
        moved = 0
        takes = lora is not None or isinstance(self.engine, LoadsState)
        if self.handoff is not None and takes:
            state = await asyncio.to_thread(self.handoff.take, event.path, event.sha256)
            if state is not None:
                try:
                    await load_published(self.engine, event.path, event.version, state)
                    memory = isinstance(self.handoff, InProcessWeights)
                    transport = "memory" if memory else "shared"
                    moved = sum(t.numel() * t.element_size() for t in state.values())
                except StateNotAccepted as e:  # e.g. SGLang's tensor path without a GPU here
                    log.info(
                        "%s: v%d as tensors refused (%s); loading the file",
                        self.name,
                        event.version,
                        e,
                    )
            del state  # a mapped buffer is released as soon as the copy is done
        if transport == "file" and not event.durable:
            return False
        if transport == "file":
            if self.verify:
                digest = await asyncio.to_thread(sha256_file, event.path)
                if digest != event.sha256:
                    raise EngineError(
                        f"weights v{event.version} at {event.path}: sha256 {digest} does not "
                        f"match the published {event.sha256}"
                    )
            await load_published(self.engine, event.path, event.version)
            moved = (await asyncio.to_thread(os.stat, event.path)).st_size
        await self.publish(
            WeightsLoaded(
                run_id=self.run_id,
                event_id=derive_id(self.run_id, "WeightsLoaded", self.label, event.version),
                version=event.version,
                engine=self.label,
                latency_ms=max(0.0, (time.time() - event.ts) * 1e3),
                transport=transport,
                bytes=moved,
                load_ms=(time.perf_counter() - start) * 1e3,
                adapter=lora is not None,
            )
        )
        return True


# The newest version whose checkpoint is on disk: published durable, or made durable later by
# CheckpointSaved (old logs: every published version is durable). A newer version published
# before its file (trainer.background_checkpoint, trainer.checkpoint_every) reaches engines
# from memory only. Also where a resumed run's engines start (stacx.launch.roles).
NEWEST_DURABLE_SQL = """
SELECT version, path, sha256, ts, true AS durable FROM (
    SELECT version, path, sha256, ts FROM weights_published WHERE coalesce(durable, true)
    UNION ALL SELECT version, path, sha256, ts FROM checkpoint_saved)
ORDER BY version DESC, ts DESC LIMIT 1"""

# the newest published version (durable or not); then NEWEST_DURABLE_SQL
_NEWEST_PUBLISHED = """
SELECT version, path, sha256, ts, coalesce(durable, true) AS durable FROM weights_published
ORDER BY version DESC, ts DESC LIMIT 1"""


async def load_published(
    engine: Engine, path: str, version: int, state: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Hand published version ``version`` (weights file ``path``; its tensors ``state`` when
    already in memory) to ``engine``: a LoRA adapter (``adapter_config.json`` beside ``path``)
    through `LoadsAdapter`, else tensors through `LoadsState` or the file."""
    lora = adapters.adapter_dir(path)
    if lora is not None:
        if not isinstance(engine, LoadsAdapter):
            raise EngineError(
                f"{engine.name}: weights v{version} are a LoRA adapter ({lora}) and this engine "
                "cannot serve adapters (backends torch and sglang can)"
            )
        await engine.load_adapter(str(lora), version, state)
    elif state is not None:
        assert isinstance(engine, LoadsState)
        await engine.load_state(state, version)
    else:
        await engine.load_weights(path, version)
