"""Harbor tasks written as Harbor writes them today (tests/harbor/fixtures), run through
`stacx tasks check --agent oracle` (the launcher, the episode runner, real Docker containers,
the real verifier), one property per test; then the run exported as a Harbor job dir and
imported back, and the import replayed into SFT."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiodocker
import pytest

from stacx.launch.presets import CheckRow, check_tasks
from stacx.store.db import connect_run

from .conftest import FIXTURES, stacx

pytestmark = pytest.mark.docker


def rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = connect_run(run_dir)
    try:
        return [tuple(r) for r in con.execute(sql).fetchall()]
    finally:
        con.close()


def by_task(run_dir: Path, column: str, table: str) -> dict[str, object]:
    sql = (
        f"select s.task_id, t.{column} from {table} t join episode_started s "
        "using (episode_id) order by t._seq"
    )
    return {str(k): v for k, v in rows(run_dir, sql)}


def episode_of(run_dir: Path, task_id: str) -> str:
    """The one episode of `task_id` in the run."""
    ((episode,),) = rows(
        run_dir, f"select episode_id from episode_started where task_id = '{task_id}'"
    )
    return str(episode)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, base_images: object) -> tuple[Path, str, int]:
    """`stacx tasks check` on good tasks, a multi-step task and a broken one: (run, stdout, rc)."""
    run_dir = tmp_path_factory.mktemp("mixed") / "run"
    done = stacx("tasks", "check", FIXTURES / "mixed", "--agent", "oracle", "--run-dir", run_dir)
    return run_dir, done.stdout + done.stderr, done.returncode


@pytest.fixture(scope="module")
def features(
    tmp_path_factory: pytest.TempPathFactory, base_images: object
) -> tuple[Path, dict[str, CheckRow]]:
    run_dir = tmp_path_factory.mktemp("features") / "run"
    out, found = asyncio.run(check_tasks(FIXTURES / "features", "oracle", run_dir=run_dir))
    return out, {r.task_id: r for r in found}


def test_check_reports_each_task_and_scores_the_good_ones(mixed: tuple[Path, str, int]) -> None:
    _, out, rc = mixed
    assert rc == 1  # one task does not load
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 3}
    assert "ok" in lines["hello"] and "│ 1 " in lines["hello"]
    assert "ok" in lines["two-steps"] and "│ 1 " in lines["two-steps"]
    assert "FAIL" in lines["broken"] and "task_invalid" in lines["broken"]
    assert "oracle: 2/3 ok" in out


def test_multi_step_runs_in_one_environment_with_per_step_rewards(
    mixed: tuple[Path, str, int],
) -> None:
    run_dir = mixed[0]
    metrics = json.loads(str(by_task(run_dir, "metrics_json", "reward_assigned")["two-steps"]))
    # extend's test checks that create's file is still there: the same container
    assert metrics == {"reward": 1.0, "step.create.reward": 1.0, "step.extend.reward": 1.0}
    turns = rows(
        run_dir,
        "select t.turn from turn_generated t join episode_started s "
        "using (episode_id) where s.task_id = 'two-steps' order by t.turn",
    )
    assert [t[0] for t in turns] == [0, 1, 2, 3]  # two steps, two oracle turns each


def test_reward_json_first_and_the_verifiers_output_next_to_it(
    mixed: tuple[Path, str, int],
) -> None:
    run_dir = mixed[0]
    assert by_task(run_dir, "reward", "reward_assigned")["hello"] == 1.0  # reward.txt said 0
    assert "verifier says: checked" in str(
        by_task(run_dir, "verifier_output", "reward_assigned")["hello"]
    )


def test_agent_has_no_route_out_and_the_verifier_phase_has_one(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    assert found["network-phases"].reward == 1.0
    out = str(by_task(run_dir, "verifier_output", "reward_assigned")["network-phases"])
    assert "agent phase: 1 line(s)" in out  # /proc/net/route: its header only


def test_workdir_env_and_the_users_of_each_phase(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    out = str(by_task(run_dir, "verifier_output", "reward_assigned")["workdir-env-user"])
    assert "saw: /srv/work nobody bar; verifier: /srv/work root" in out
    assert found["workdir-env-user"].reward == 1.0


def test_the_stand_in_bases_workdir_does_not_leak(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    assert features[1]["no-workdir"].reward == 1.0  # pwd is /, as on ubuntu:24.04


def test_python_312_and_ubuntu_2404_run_on_noble_unwarned(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    assert found["python312"].reward == 1.0  # Python 3.12, no pytest, COPY --from mapped
    warned = dict(rows(run_dir, "select task_id, message from episode_warned"))
    # python:3.12 on noble's 3.12 and ubuntu:24.04 on noble are faithful: nothing to warn
    assert not {"python312", "no-workdir", "workdir-env-user"} & set(warned), warned


def test_buildkit_mounts_and_heredocs_build(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    assert found["buildkit-syntax"].reward == 1.0, by_task(
        run_dir, "verifier_output", "reward_assigned"
    ).get("buildkit-syntax")


def test_compose_sidecar_is_reachable_by_name_once_healthy(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    out = str(by_task(run_dir, "verifier_output", "reward_assigned").get("compose-services"))
    assert found["compose-services"].reward == 1.0, out
    assert "got: hello from web" in out  # main's env from the compose file, the web service


def test_a_child_killed_by_the_oom_killer_is_an_outcome(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    assert found["oom-child"].ok and found["oom-child"].failure is None
    assert "OOM killer fired" in str(
        by_task(run_dir, "verifier_output", "reward_assigned")["oom-child"]
    )


def test_separate_verifier_sees_only_the_artifacts_and_the_convention_dir(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    assert found["separate-verifier"].reward == 1.0  # no /app/secret.txt there
    (episode,) = rows(
        run_dir, "select episode_id from episode_started where task_id = 'separate-verifier'"
    )
    kept = run_dir / "artifacts" / str(episode[0])
    assert (kept / "out" / "answer").read_text() == "42\n"  # Harbor: the base name
    assert (kept / "report.txt").read_text() == "all good\n"
    assert (kept / "marker").read_text() == "handed-over\n"  # from /logs/artifacts


def test_step_healthchecks_run_before_each_steps_agent_and_step_artifacts_are_kept(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    out = by_task(run_dir, "verifier_output", "reward_assigned").get("step-checks-artifacts")
    # second's check needs what first's agent wrote: it ran after step one, before step two
    assert found["step-checks-artifacts"].reward == 1.0, out
    (episode,) = rows(
        run_dir, "select episode_id from episode_started where task_id = 'step-checks-artifacts'"
    )
    steps = run_dir / "artifacts" / str(episode[0]) / "steps"
    first, second = steps / "first" / "artifacts", steps / "second" / "artifacts"
    assert (first / "first.txt").read_text() == "agent after check\nverified\n"
    assert [p.name for p in (second / "second-out").iterdir()] == ["keep.txt"]  # *.tmp out
    for step in (first, second):  # the task's own artifacts, at every step's collection
        assert (step / "shared.txt").read_text() == "shared\n"


def test_exported_trials_carry_their_artifacts_in_harbors_layout(
    features: tuple[Path, dict[str, CheckRow]], tmp_path: Path
) -> None:
    done = stacx("export", "harbor", features[0], "-o", tmp_path / "job")
    assert done.returncode == 0, done.stderr
    (separate,) = (tmp_path / "job").glob("separate-verifier__*")
    assert (separate / "artifacts" / "out" / "answer").read_text() == "42\n"
    (steps,) = (tmp_path / "job").glob("step-checks-artifacts__*")
    assert (steps / "steps" / "first" / "artifacts" / "first.txt").is_file()
    assert (steps / "steps" / "second" / "artifacts" / "second-out" / "keep.txt").is_file()


def test_harbor_job_export_import_and_replay_into_sft(
    mixed: tuple[Path, str, int], tmp_path: Path
) -> None:
    run_dir = mixed[0]
    job = tmp_path / "job"
    done = stacx("export", "harbor", run_dir, "-o", job)
    assert done.returncode == 0, done.stderr
    result = json.loads((job / "result.json").read_text())
    (stats,) = result["stats"]["evals"].values()
    assert stats["n_trials"] == 2 and stats["pass_at_k"] == {"1": 1.0}
    assert sorted(stats["reward_stats"]["reward"]["1"]) == sorted(
        p.name for p in job.iterdir() if p.is_dir()
    )
    trial = next(job.glob("two-steps__*"))
    trial_result = json.loads((trial / "result.json").read_text())
    assert trial_result["verifier_result"]["rewards"]["step.extend.reward"] == 1.0
    assert trial_result["agent_execution"]["started_at"] and trial_result["verifier"]
    traj = json.loads((trial / "agent" / "trajectory.json").read_text())
    assert traj["schema_version"] == "ATIF-v1.7"
    agent_steps = [s for s in traj["steps"] if s["source"] == "agent"]
    recorded = rows(
        run_dir,
        "select t.prompt_ids, t.output_ids from turns t join "
        "episode_started s using (episode_id) where s.task_id = 'two-steps' "
        "order by t.turn",
    )
    assert [
        (s["metrics"]["prompt_token_ids"], s["metrics"]["completion_token_ids"])
        for s in agent_steps
    ] == [(list(p), list(o)) for p, o in recorded]
    # back in, through the recorder: the same token ids, rewards and step metrics
    imported = tmp_path / "R2"
    done = stacx("import", "harbor", job, "--into", imported)
    assert done.returncode == 0, done.stderr
    again = rows(
        imported,
        "select t.prompt_ids, t.output_ids from turns t join "
        "episode_started s using (episode_id) where s.task_id = 'two-steps' "
        "order by t.turn",
    )
    assert [(list(p), list(o)) for p, o in again] == [(list(p), list(o)) for p, o in recorded]
    assert sorted(rows(imported, "select task_id, status, reward from episodes")) == [
        ("hello", "scored", 1.0),
        ("two-steps", "scored", 1.0),
    ]
    # and SFT trains on it (one step, on the imported demonstrations and the recipe's own)
    trained = stacx(
        "replay",
        "--from",
        imported,
        "--into",
        "recipes/swe/sft_tiny.toml",
        "--run-dir",
        tmp_path / "R3",
        "--set",
        "trainer.steps=1",
        "--set",
        "eval={}",
        cwd=Path(__file__).resolve().parents[2],
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert rows(tmp_path / "R3", "select count(*) from train_step_finished")[0][0] >= 1
    assert rows(tmp_path / "R3", "select count(*) from event_imported")[0][0] > 0


def test_text_only_trajectory_is_retokenized_and_marked(tmp_path: Path) -> None:
    trial = tmp_path / "job" / "hello__abc"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text(
        json.dumps(
            {
                "task_name": "hello",
                "trial_name": "hello__abc",
                "config": {"job_id": "j"},
                "agent_info": {"name": "terminus-2"},
                "verifier_result": {"rewards": {"reward": 1}},
            }
        )
    )
    (trial / "agent" / "trajectory.json").write_text(
        json.dumps(
            {
                "schema_version": "ATIF-v1.4",
                "session_id": "s",
                "agent": {"name": "terminus-2"},
                "steps": [
                    {"step_id": 1, "source": "user", "message": "Write hello."},
                    {
                        "step_id": 2,
                        "source": "agent",
                        "message": "echo hello > hello.txt",
                        "tool_calls": [
                            {
                                "tool_call_id": "c1",
                                "function_name": "bash",
                                "arguments": {"command": "echo hello > hello.txt"},
                            }
                        ],
                        "observation": {"results": [{"source_call_id": "c1", "content": ""}]},
                    },
                ],
            }
        )
    )
    done = stacx("import", "harbor", tmp_path / "job", "--into", tmp_path / "R")
    assert done.returncode == 0, done.stderr
    ((prompt, output, retok, logprobs),) = rows(
        tmp_path / "R", "select prompt_ids, output_ids, retokenized, logprobs from turn_generated"
    )
    assert retok is True and logprobs is None and len(prompt) > 3 and len(output) > 3
    from transformers import AutoTokenizer

    from stacx.hf import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    assert "Write hello." in tok.decode(prompt) and "echo hello" in tok.decode(output)
    assert rows(tmp_path / "R", "select tool, arguments_json from tool_called") == [
        ("bash", '{"command": "echo hello > hello.txt"}')
    ]
    shutil.rmtree(tmp_path / "R")


def test_a_failing_step_setup_is_that_steps_exception_and_the_steps_that_ran_are_scored(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    row = found["step-setup-fails"]
    assert row.failure is None and row.reward == 1.0  # Harbor's mean: the verified step only
    assert row.reason == "step two: Step 'two' setup.sh exited with code 3: no data for step two"
    ep = episode_of(run_dir, "step-setup-fails")
    metrics = json.loads(
        str(by_task(run_dir, "metrics_json", "reward_assigned")["step-setup-fails"])
    )
    assert metrics == {"reward": 1.0, "step.one.reward": 1.0}  # step three never ran
    ((step, kind, message),) = rows(
        run_dir, f"select step, exception_type, message from step_failed where episode_id = '{ep}'"
    )
    assert (step, kind) == ("two", "RuntimeError")
    assert message == "Step 'two' setup.sh exited with code 3: no data for step two"
    assert rows(run_dir, f"select stop_reason from episode_finished where episode_id = '{ep}'") == [
        ("step_failed",)
    ]
    turns = rows(run_dir, f"select turn from turn_generated where episode_id = '{ep}'")
    assert sorted(t[0] for t in turns) == [0, 1]  # the oracle's two turns of step one
    out = str(by_task(run_dir, "verifier_output", "reward_assigned")["step-setup-fails"])
    assert "[step two]\nRuntimeError: Step 'two' setup.sh exited with code 3" in out
    steps = run_dir / "artifacts" / ep / "steps"  # the failed step's collection still runs
    assert sorted(p.name for p in steps.iterdir()) == ["one", "two"]
    assert (steps / "two" / "artifacts" / "one.txt").read_text() == "one\n"


def test_a_failing_first_step_healthcheck_scores_nothing_and_records_why(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    row = found["step-check-fails"]
    assert row.failure is None and row.reward == 0.0 and not row.ok  # an outcome, not infra
    assert row.reason.startswith("step first: healthcheck `test -f /app/never-there` failed")
    ep = episode_of(run_dir, "step-check-fails")
    ((step, kind, message),) = rows(
        run_dir, f"select step, exception_type, message from step_failed where episode_id = '{ep}'"
    )
    assert (step, kind) == ("first", "HealthcheckError")
    assert message.startswith("healthcheck `test -f /app/never-there` failed 2 time(s)")
    assert rows(run_dir, f"select count(*) from turn_generated where episode_id = '{ep}'") == [(0,)]


def test_exported_trials_carry_the_failed_steps_exception(
    features: tuple[Path, dict[str, CheckRow]], tmp_path: Path
) -> None:
    done = stacx("export", "harbor", features[0], "-o", tmp_path / "job")
    assert done.returncode == 0, done.stderr
    (trial,) = (tmp_path / "job").glob("step-setup-fails__*")
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None  # Harbor: the step's, not the trial's
    one, two = result["step_results"]
    assert one == {
        "step_name": "one",
        "verifier_result": {"rewards": {"reward": 1.0}},
        "exception_info": None,
    }
    assert two["step_name"] == "two" and two["verifier_result"] is None
    assert two["exception_info"]["exception_type"] == "RuntimeError"
    assert "setup.sh exited with code 3" in two["exception_info"]["exception_message"]
    (single,) = (tmp_path / "job").glob("python312__*")
    assert json.loads((single / "result.json").read_text())["step_results"] is None


async def _volumes_of(episode_id: str) -> list[str]:
    async with aiodocker.Docker() as docker:
        listed = await docker.volumes.list(filters={"label": [f"stacx.episode_id={episode_id}"]})
    return [v["Name"] for v in listed.get("Volumes") or []]


def test_compose_volumes_a_sidecar_writes_main_reads_and_they_go_with_the_episode(
    features: tuple[Path, dict[str, CheckRow]],
) -> None:
    run_dir, found = features
    out = by_task(run_dir, "verifier_output", "reward_assigned").get("compose-volumes")
    # the writer's note through the named volume, the task's data dir bind-mounted, both :ro
    assert found["compose-volumes"].reward == 1.0, out
    assert asyncio.run(_volumes_of(episode_of(run_dir, "compose-volumes"))) == []  # removed
