"""ATIF v1.7 both ways (stacx.harbor.jobs, stacx.harbor.job_import): export writes v1.7's fields (trajectory_id,
llm_call_count, `extra` on tool calls and observation results); import reads v1.4 to v1.7,
restores what `extra` kept, turns embedded sub-agent trajectories into further segments of the
episode, and refuses another schema version by name.

The last test validates the export with Harbor's own pydantic model (harbor 0.26.0 from PyPI,
in the trixie base image: harbor needs Python >= 3.12, this host has 3.11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from stacx import events as ev
from stacx.actors.run import RunContext
from stacx.errors import StacxError
from stacx.harbor.job_import import job_events
from stacx.harbor.jobs import export_job
from stacx.store import db

ROOT = Path(__file__).resolve().parents[2]


async def _run(run_dir: Path) -> None:
    async with RunContext(run_dir, recipe="atif") as run:
        r = run.run_id
        await run.emit(ev.EpisodeStarted(run_id=r, episode_id="e", task_id="t", group_id="g"))
        await run.emit(
            ev.TurnGenerated(
                run_id=r,
                episode_id="e",
                turn=0,
                prompt_ids=[1, 2],
                output_ids=[3],
                logprobs=[-0.5],
                weight_version=0,
                engine="torch",
            )
        )
        await run.emit(
            ev.ToolCalled(
                run_id=r,
                episode_id="e",
                turn=0,
                call_id="c",
                tool="bash",
                arguments_json='{"command": "false"}',
            )
        )
        await run.emit(
            ev.ToolReturned(
                run_id=r,
                episode_id="e",
                turn=0,
                call_id="c",
                tool="bash",
                output="no",
                exit_code=3,
                duration_ms=12.5,
            )
        )
        await run.emit(
            ev.ToolCalled(
                run_id=r,
                episode_id="e",
                turn=0,
                call_id="d",
                tool="bash",
                arguments_json="{not json",
            )
        )
        await run.emit(
            ev.ToolReturned(
                run_id=r, episode_id="e", turn=0, call_id="d", tool="bash", error="malformed call"
            )
        )
        await run.emit(
            ev.TurnGenerated(
                run_id=r,
                episode_id="e",
                turn=1,
                prompt_ids=[1, 2, 3, 4],
                output_ids=[5],
                actor="oracle",
            )
        )
        await run.emit(
            ev.EpisodeFinished(run_id=r, episode_id="e", stop_reason="submitted", n_turns=2)
        )
        await run.emit(ev.RewardAssigned(run_id=r, episode_id="e", reward=1.0))


def _rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(db.db_path(run_dir)), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture
async def job(tmp_path: Path) -> Path:
    await _run(tmp_path / "run")
    export_job(tmp_path / "run", tmp_path / "job")
    return tmp_path / "job"


def test_export_writes_v17_and_import_restores_tool_results(job: Path, tmp_path: Path) -> None:
    (traj_file,) = (tmp_path / "job").glob("t__*/agent/trajectory.json")
    traj = json.loads(traj_file.read_text())
    assert traj["schema_version"] == "ATIF-v1.7" and traj["trajectory_id"] == "e"
    model, oracle = (s for s in traj["steps"] if s["source"] == "agent")
    assert (
        model["llm_call_count"] == 1 and oracle["llm_call_count"] is None
    )  # scripted: no LLM call
    ok, bad = model["tool_calls"]
    assert ok["arguments"] == {"command": "false"} and "extra" not in ok
    assert bad["arguments"] == {} and bad["extra"] == {"stacx": {"arguments_json": "{not json"}}
    first = model["observation"]["results"][0]
    assert first["content"] == "no" and first["extra"]["stacx"]["exit_code"] == 3
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "import",
            "harbor",
            str(tmp_path / "job"),
            "--into",
            str(tmp_path / "back"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "STACX_STRICT": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(
        _rows(
            tmp_path / "back",
            "select call_id, output, exit_code, error, duration_ms from tool_returned",
        )
    ) == [("c", "no", 3, "", 12.5), ("d", "", None, "malformed call", 0.0)]
    assert sorted(_rows(tmp_path / "back", "select call_id, arguments_json from tool_called")) == [
        ("c", '{"command": "false"}'),
        ("d", "{not json"),
    ]


def _trial(job: Path, traj: dict[str, object]) -> None:
    trial = job / "t__x"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text(
        json.dumps(
            {
                "task_name": "t",
                "trial_name": "t__x",
                "config": {"job_id": "j"},
                "verifier_result": {"rewards": {"reward": 1}},
            }
        )
    )
    (trial / "agent" / "trajectory.json").write_text(json.dumps(traj))


def _agent(step_id: int, prompt: list[int], output: list[int]) -> dict[str, object]:
    return {
        "step_id": step_id,
        "source": "agent",
        "message": "",
        "metrics": {"prompt_token_ids": prompt, "completion_token_ids": output},
    }


def test_embedded_subagents_become_further_segments_of_the_episode(tmp_path: Path) -> None:
    _trial(
        tmp_path / "job",
        {
            "schema_version": "ATIF-v1.7",
            "trajectory_id": "main",
            "agent": {"name": "a"},
            "steps": [_agent(1, [1, 2], [3]), _agent(2, [1, 2, 3, 4], [5])],
            "subagent_trajectories": [
                {
                    "schema_version": "ATIF-v1.7",
                    "trajectory_id": "sub",
                    "agent": {"name": "b"},
                    "steps": [_agent(1, [7], [8])],
                }
            ],
        },
    )
    turns = [
        e
        for e in job_events([tmp_path / "job"], "r", tokenizer=None)
        if isinstance(e, ev.TurnGenerated)
    ]
    assert [(t.turn, t.segment, t.prefix_len, t.prompt_ids, t.output_ids) for t in turns] == [
        (0, 0, 0, [1, 2], [3]),
        (1, 0, 3, [4], [5]),
        (2, 1, 0, [7], [8]),
    ]


@pytest.mark.parametrize("version", ["ATIF-v1.4", "ATIF-v1.5", "ATIF-v1.6"])
def test_v14_to_v16_are_read(tmp_path: Path, version: str) -> None:
    _trial(
        tmp_path / "job",
        {"schema_version": version, "session_id": "s", "steps": [_agent(1, [1], [2])]},
    )
    assert (
        sum(
            isinstance(e, ev.TurnGenerated)
            for e in job_events([tmp_path / "job"], "r", tokenizer=None)
        )
        == 1
    )


def test_another_schema_version_is_refused_by_name(tmp_path: Path) -> None:
    _trial(tmp_path / "job", {"schema_version": "ATIF-v1.2", "steps": []})
    with pytest.raises(
        StacxError, match=r"trajectory.json: schema_version 'ATIF-v1.2': accepted: ATIF-v1.4, "
    ):
        list(job_events([tmp_path / "job"], "r", tokenizer=None))


HARBOR = "0.26.0"  # Harbor's own ATIF models (harbor.models.trajectories), from PyPI
VALIDATE = """
import json, pathlib, sys
from harbor.models.trajectories import Trajectory
files = sorted(pathlib.Path("/job").glob("*/agent/trajectory.json"))
for f in files:
    t = Trajectory.model_validate_json(f.read_text())
    print(f.parent.parent.name, t.schema_version, len(t.steps))
print("validated", len(files))
"""


@pytest.mark.docker
def test_harbors_own_trajectory_model_parses_the_export(
    job: Path, base_images: tuple[str, str]
) -> None:
    """The exported trajectory.json files validate under Harbor's own pydantic model (harbor
    needs Python >= 3.12: it runs in the trixie base image, which has 3.13)."""
    _, trixie = base_images
    image = f"stacx/test-harbor-atif:{HARBOR}"
    dockerfile = (
        f"FROM {trixie}\n"
        "RUN python3 -m venv /h && /h/bin/pip install -q pydantic "
        f"&& /h/bin/pip install -q --no-deps harbor=={HARBOR}\n"
    )
    built = subprocess.run(
        ["docker", "build", "-q", "-t", image, "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    done = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{job}:/job:ro",
            image,
            "/h/bin/python",
            "-c",
            VALIDATE,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("validated 1"), done.stdout
    assert "ATIF-v1.7 3" in done.stdout  # the user instruction + both agent steps, as exported
