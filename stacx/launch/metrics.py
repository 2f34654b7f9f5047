"""Metrics writers, fed from the log by SQL: TensorBoard always (``<run_dir>/tb/``: ``train/*`` per
step, ``rollout/*`` reward per weight version), Weights & Biases when ``WANDB_API_KEY`` is set. A
restarted writer re-reads the log and opens TensorBoard with ``purge_step=0``, so nothing is
doubled. Limits: W&B errors are logged and disable W&B for the run, never stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from stacx.actors.base import Query

if TYPE_CHECKING:
    from stacx.launch.recipe import LoggingSection

log = logging.getLogger(__name__)

STEPS_SQL = """SELECT step, loss, reward_mean, n_samples, tokens, duration_ms FROM train_steps
WHERE step > {after} ORDER BY step"""
VERSIONS_SQL = """SELECT first_weight_version AS weight_version, avg(reward) AS reward, count(*) AS n,
       avg(CASE WHEN reward >= 1 THEN 1.0 ELSE 0.0 END) AS pass_rate
FROM episodes WHERE status = 'scored' AND first_weight_version IS NOT NULL
GROUP BY 1 ORDER BY 1"""


class Sink(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, logdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir), purge_step=0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, run_id: str, config: dict[str, object], run_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project, id=run_id, name=run_id, resume="allow", config=config, dir=str(run_dir)
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "step": step})

    def close(self) -> None:
        self.run.finish()


def make_sinks(
    run_dir: Path, run_id: str, config: dict[str, object], settings: LoggingSection
) -> list[Sink]:
    sinks: list[Sink] = []
    if settings.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if os.environ.get("WANDB_API_KEY"):
        try:
            sinks.append(WandbSink(settings.wandb_project, run_id, config, run_dir))
        except Exception as exc:  # missing package, network: W&B is optional
            log.warning("W&B disabled: %r", exc)
    return sinks


class MetricsWriter:
    """Copies new train steps and per-version rewards from the log to the sinks."""

    def __init__(
        self, query: Query, sinks: Callable[[], list[Sink]], *, interval_s: float = 2.0
    ) -> None:
        self.query = query
        # `sinks` is called (in a thread) on the first run(): TensorBoard imports torch, which
        # may take seconds that the run should not wait for.
        self._factory = sinks
        self.sinks: list[Sink] = []
        self._ready: asyncio.Task[list[Sink]] | None = None
        self.interval_s = interval_s
        self.last_step = -1
        self.versions: dict[int, int] = {}  # version -> episodes written
        self._failing: str | None = None  # the flush error last reported (reported once)

    async def flush(self) -> None:
        steps = await self.query(STEPS_SQL.format(after=self.last_step))
        for row in steps.to_pylist():
            values = {
                f"train/{k}": float(row[k])
                for k in ("loss", "reward_mean", "n_samples", "tokens", "duration_ms")
                if row[k] is not None
            }
            self._write(values, int(row["step"]))
            self.last_step = int(row["step"])
        by_version = await self.query(VERSIONS_SQL)
        for row in by_version.to_pylist():
            v, n = int(row["weight_version"]), int(row["n"])
            if self.versions.get(v) != n:  # rewritten as episodes of that version keep coming
                self._write(
                    {
                        "rollout/reward": float(row["reward"]),
                        "rollout/pass_rate": float(row["pass_rate"]),
                        "rollout/episodes": float(n),
                    },
                    v,
                )
                self.versions[v] = n

    def _write(self, values: dict[str, float], step: int) -> None:
        for sink in list(self.sinks):
            try:
                sink.scalars(values, step)
            except Exception:
                log.exception("metrics sink %s failed; disabled", type(sink).__name__)
                self.sinks.remove(sink)

    async def _sinks(self) -> None:
        if self._ready is None:
            self._ready = asyncio.create_task(asyncio.to_thread(self._factory))
        self.sinks = await asyncio.shield(self._ready)

    async def run(self) -> None:
        """Write new metrics every ``interval_s`` until cancelled; then call :meth:`finish`."""
        await self._sinks()
        while True:
            await self._flush_reported()
            await asyncio.sleep(self.interval_s)

    async def _flush_reported(self) -> None:
        """Flush; a failure is logged with its traceback once (not every interval) until a flush
        succeeds again. The run goes on without its metrics."""
        try:
            await self.flush()
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            if what != self._failing:
                log.exception("metrics not written (reported once until it recovers)")
                self._failing = what
            return
        if self._failing is not None:
            log.info("metrics written again (after: %s)", self._failing)
            self._failing = None

    async def finish(self) -> None:
        """Write what is left and close the sinks (waits for them if they are being created)."""
        await self._sinks()
        await self._flush_reported()
        for sink in self.sinks:
            with contextlib.suppress(Exception):
                sink.close()
