"""Resume rules: may this recipe start (or continue) in this run directory? No log: a fresh run. A
log: the same run continues if the recipe equals its first RunStarted's (``placement`` and
``logging`` aside), else the launch is refused with the diff. A live launcher on the directory is
refused (two writers). The rest of resuming is read from the log by the actors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import msgspec

from stacx.errors import ConfigError
from stacx.launch.loader import ConfigDict, diff
from stacx.store import db

IGNORED_SECTIONS = ("placement", "logging")


class Previous(msgspec.Struct, frozen=True, kw_only=True):
    """What the log says about earlier attempts of this run."""

    run_id: str
    attempts: int
    config: ConfigDict
    status: str


def identity(config: ConfigDict) -> ConfigDict:
    return {k: v for k, v in config.items() if k not in IGNORED_SECTIONS}


def pid_alive(pid: object) -> bool:
    """Whether `pid` (a run file's) is a live process on this host other than this one (one of
    another user's counts: signalling it is refused, not unknown)."""
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    return True


def read_previous(run_dir: Path) -> Previous | None:
    """The first RunStarted of an existing run, or None for a fresh directory."""
    if not db.db_path(run_dir).is_file():
        return None
    meta = db.read_run_file(run_dir)
    if meta.get("status") == "running" and pid_alive(meta.get("pid")):
        raise ConfigError(
            f"{run_dir}: in use by a live launcher (pid {meta['pid']}); "
            "wait for it or stop it first"
        )
    try:
        con = duckdb.connect(str(db.db_path(run_dir)), read_only=True)
    except duckdb.Error as exc:
        raise ConfigError(f"{run_dir}: its log cannot be opened ({exc})") from exc
    with con:
        row = con.execute(
            "select config_json, run_id from run_started order by _seq limit 1"
        ).fetchone()
    if row is None:  # the log exists but the first RunStarted never got recorded
        return None
    return Previous(
        run_id=str(row[1]),
        attempts=int(meta.get("attempts", 1)),  # type: ignore[call-overload]
        config=json.loads(row[0]),
        status=str(meta.get("status", "?")),
    )


def check_resume(run_dir: Path, config: ConfigDict) -> Previous | None:
    """None for a fresh run; the previous attempt's facts to resume; ConfigError with the diff."""
    previous = read_previous(run_dir)
    if previous is None:
        return None
    changes = diff(identity(previous.config), identity(config))
    if changes:
        lines = "\n  ".join(changes)
        raise ConfigError(
            f"{run_dir} holds run {previous.run_id} of a different recipe; refusing to mix them "
            f"in one log. Differences (recorded -> now):\n  {lines}\n"
            "Use another --run-dir, or the recorded recipe to resume."
        )
    return previous


async def remove_orphan_sandboxes(run_id: str) -> int:
    """Remove this run's sandbox containers left by a dead attempt (kill -9 gives its pool no chance
    to clean up). Called before any role starts; with Docker unreachable it removes nothing."""
    try:
        import aiodocker

        from stacx.sandbox.gc import collect_garbage

        async with aiodocker.Docker() as docker:
            return len(await collect_garbage(docker, run_id=run_id))
    except Exception:  # no Docker here: nothing to clean, and not this function's error to raise
        return 0
