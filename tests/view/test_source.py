"""The viewer's read side on a live run: while another process (the run's recorder) holds the
log, the viewer reads a snapshot copy, sees the events recorded so far, and deletes the copy it
made; queries typed by the user can neither write nor read files."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from stacx import events as ev
from stacx.actors.run import RunContext

ROOT = Path(__file__).resolve().parents[2]
READ = """
import json, sys
from stacx.errors import StacxError
from stacx.view.source import Source
s = Source([sys.argv[1]], min_reopen_s=0.0)
out = {"n": s.query("select count(*) from episodes").rows[0][0], "snapshots": len(s._snaps)}
for q in ("copy episode_started to '/tmp/out.csv'", "select * from read_text('/etc/hostname')"):
    try:
        s.query_user(q)
        out[q] = "ran"
    except StacxError as exc:
        out[q] = str(exc)
s.close()
print(json.dumps(out))
"""


def _read(run_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", READ, str(run_dir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _snapshots() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("stacx-snap-*"))


async def test_a_live_run_is_read_from_a_snapshot_that_is_then_removed(tmp_path: Path) -> None:
    before = _snapshots()
    async with RunContext(tmp_path / "run", recipe="live") as run:
        for n in (1, 2):
            await run.emit(
                ev.EpisodeStarted(run_id=run.run_id, episode_id=f"e{n}", task_id="t", group_id="g")
            )
            await run.sync(60)
            got = _read(tmp_path / "run")
            assert got["n"] == n and got["snapshots"] == 1  # the live file was copied, and read
            assert "disabled by configuration" in str(got["copy episode_started to '/tmp/out.csv'"])
            assert "disabled by configuration" in str(
                got["select * from read_text('/etc/hostname')"]
            )
    assert _snapshots() == before  # each copy was deleted when the viewer closed it


async def test_several_runs_are_curved_by_split_an_eval_runs_episodes_as_eval(
    tmp_path: Path,
) -> None:
    """Multi-run mode (no reward_by_weight_version per run): a `stacx eval` run's episodes
    (TaskScheduled.split = 'eval', role '') are labelled eval, not train."""
    from stacx.view.pages import reward_curve
    from stacx.view.source import Source

    ids = []
    for name, split in (("a", "eval"), ("b", "train")):
        async with RunContext(tmp_path / name, recipe=name) as run:
            r = run.run_id
            await run.emit(
                ev.TaskScheduled(
                    run_id=r, task_id="t", task_path="t", group_id=f"g{name}", split=split
                )
            )
            await run.emit(
                ev.EpisodeStarted(run_id=r, episode_id=f"e{name}", task_id="t", group_id=f"g{name}")
            )
            await run.emit(ev.RewardAssigned(run_id=r, episode_id=f"e{name}", reward=1.0))
            await run.sync(60)
            ids.append(r)
    source = Source([tmp_path / "a", tmp_path / "b"])
    try:
        curves = [reward_curve(source, r).dicts() for r in ids]
    finally:
        source.close()
    assert [[(c["split"], c["n_episodes"]) for c in curve] for curve in curves] == [
        [("eval", 1)],
        [("train", 1)],
    ]
