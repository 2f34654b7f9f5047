"""The remote backend beyond the Sandbox contract (which tests/sandbox/backends.py runs against
it): two `stacx sandbox serve` processes sharing this host's dockerd, an oracle eval spread over
both, one service killed with -9 mid-run, a silent (stopped) service, tokens, the admin CLI.
Real nats-server on a free port, real Docker containers, real subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiodocker
import msgspec
import pytest

from stacx.bus.client import connect
from stacx.bus.server import EmbeddedNats
from stacx.errors import ConfigError
from stacx.events import FailureKind
from stacx.ports import InfraFailure, Limits
from stacx.sandbox.gc import list_sandboxes
from stacx.sandbox.remote import RemoteEnvironments
from stacx.sandbox.remote_hosts import discover
from stacx.store.db import connect_run
from tests.conftest import stacx_bin
from tests.sandbox.backends import limits_task, serving
from tests.sandbox.conftest import make_task

pytestmark = pytest.mark.docker

FEATURES = Path(__file__).parents[1] / "harbor" / "fixtures" / "features"
SOLVE = "sleep 3\necho done > /app/out\n"  # long enough for the kill to land mid-episode
TEST = "if [ -f /app/out ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"


class Services:
    """`stacx sandbox serve` subprocesses on one nats-server."""

    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, service_id: str, *, slots: int = 4) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{service_id}.log", "wb")  # the child keeps it
        self.procs[service_id] = proc = subprocess.Popen(
            [
                stacx_bin(),
                "sandbox",
                "serve",
                "--url",
                self.url,
                "--id",
                service_id,
                "--slots",
                str(slots),
                "--heartbeat",
                "0.2",
                "--state-dir",
                str(self.root / f"state-{service_id}"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return proc

    async def wait_live(self, *ids: str) -> None:
        nc = await connect(self.url)
        try:
            while not set(ids) <= {a.service_id for a in await discover(nc, wait=0.3)}:
                for sid in ids:
                    code = self.procs[sid].poll()
                    assert code is None, (self.root / f"{sid}.log").read_text()
        finally:
            await nc.close()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    with EmbeddedNats(tmp_path / "nats") as server:
        svc = Services(server.url, tmp_path)
        try:
            yield svc
        finally:
            svc.stop_all()


def cli(*args: str) -> str:
    out = subprocess.run([stacx_bin(), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_eval_survives_a_service_killed_mid_run(
    services: Services, base_image: str, tmp_path: Path
) -> None:
    from stacx.launch.presets import eval_recipe, run_eval

    tasks = tmp_path / "tasks"
    for i in range(4):
        make_task(
            tasks,
            f"slow-{i}",
            test_sh=TEST,
            solve_sh=SOLVE,
            dockerfile=f"FROM {base_image}\nWORKDIR /app\n",
        )
    victim = services.start("a")
    services.start("b")
    await services.wait_live("a", "b")
    hosts = [
        json.loads(line)
        for line in cli(
            "sandbox", "hosts", "--url", services.url, "--wait", "0.5", "--format", "json"
        ).splitlines()
    ]
    assert {h["service"] for h in hosts} == {"a", "b"}
    assert all(h["free"] == 4 for h in hosts)

    recipe = eval_recipe(tasks=str(tasks), agent="oracle", concurrency=2, progress="off")
    recipe = msgspec.structs.replace(
        recipe,
        sandbox=msgspec.structs.replace(recipe.sandbox, backend="remote", url=services.url),
    )
    run = asyncio.create_task(run_eval(recipe, tmp_path / "run", echo=lambda _: None))

    nc = await connect(services.url)  # kill `a` while it holds a sandbox
    try:
        while not any(a.service_id == "a" and a.used for a in await discover(nc, wait=0.1)):
            assert not run.done(), "the run ended before service a held a sandbox"
    finally:
        await nc.close()
    await asyncio.sleep(1.0)  # into the episode (solve.sh sleeps 3 s), past its start
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    result = await run

    assert result.verdict == "completed" and result.unscored == 0
    con = connect_run(tmp_path / "run")
    rewards = con.sql(
        "SELECT s.group_id, s.sample_index, count(*), min(r.reward) FROM reward_assigned r "
        "JOIN episode_started s USING (episode_id) GROUP BY ALL"
    ).fetchall()
    assert len(rewards) == 4 and all(n == 1 and reward == 1.0 for _, _, n, reward in rewards)
    lost = con.sql(
        "SELECT failure_kind, will_retry FROM infra_failed WHERE turn IS NULL"
    ).fetchall()
    assert lost and all(f == FailureKind.SANDBOX_HOST_LOST and retry for f, retry in lost)
    # none lost: every attempt ended with a reward or a recorded failure
    open_attempts = con.sql(
        "SELECT count(*) FROM episode_started s WHERE NOT EXISTS (SELECT 1 FROM reward_assigned "
        "r WHERE r.episode_id = s.episode_id) AND NOT EXISTS (SELECT 1 FROM infra_failed f "
        "WHERE f.episode_id = s.episode_id)"
    ).fetchall()
    assert open_attempts == [(0,)]
    started = dict(con.sql("SELECT host, count(*) FROM sandbox_started GROUP BY host").fetchall())
    assert started["b"] >= 4 - started.get("a", 0)  # the retries went to b
    stopped = dict(con.sql("SELECT reason, count(*) FROM sandbox_stopped GROUP BY ALL").fetchall())
    assert stopped.get("host_lost", 0) == started.get("a", 0) - (4 - started["b"])
    con.close()

    # a's containers outlived it; any live service's gc removes them (their owner is dead):
    # `stacx sandbox gc` now, or b's own periodic gc already did on a loaded machine
    async with aiodocker.Docker() as docker:
        if orphans := [s for s in await list_sandboxes(docker) if s.pid == victim.pid]:
            assert f"removed {len(orphans)} sandbox container(s)" in cli(
                "sandbox", "gc", "--url", services.url
            )
        assert not [s for s in await list_sandboxes(docker) if s.pid == victim.pid]


async def test_a_failing_step_comes_back_as_that_steps_exception_not_as_infra(
    services: Services, base_image: str, tmp_path: Path
) -> None:
    """Harbor's step semantics through a service: a second step whose setup.sh fails (after
    the first step's verify) and a first step whose healthcheck fails (at the start) are each
    that step's StepFailed, scored from the steps that ran as locally
    (tests/harbor/test_harbor_tasks.py), never START failures retried as infra."""
    from stacx.launch.presets import eval_recipe, run_eval

    tasks = tmp_path / "tasks"
    for name in ("step-setup-fails", "step-check-fails"):
        shutil.copytree(FEATURES / name, tasks / name)
    services.start("a")
    await services.wait_live("a")
    recipe = eval_recipe(tasks=str(tasks), agent="oracle", concurrency=2, progress="off")
    recipe = msgspec.structs.replace(
        recipe,
        sandbox=msgspec.structs.replace(recipe.sandbox, backend="remote", url=services.url),
    )
    result = await run_eval(recipe, tmp_path / "run", echo=lambda _: None)
    assert result.unscored == 0
    con = connect_run(tmp_path / "run")
    try:
        failed = con.sql(
            "SELECT e.task_id, f.step, f.exception_type, f.message, e.reward, e.stop_reason "
            "FROM step_failed f JOIN episodes e USING (episode_id) ORDER BY 1"
        ).fetchall()
        infra = con.sql("SELECT count(*) FROM infra_failed").fetchall()
    finally:
        con.close()
    assert infra == [(0,)]
    (check, setup) = failed
    assert check[:3] == ("step-check-fails", "first", "HealthcheckError") and check[4] == 0.0
    assert setup[:4] == (
        "step-setup-fails",
        "two",
        "RuntimeError",
        "Step 'two' setup.sh exited with code 3: no data for step two",
    )
    assert setup[4] == 1.0  # Harbor's mean over the verified step one
    assert check[5] == setup[5] == "step_failed"


async def test_a_silent_service_fails_pending_requests_as_host_lost(
    services: Services, base_image: str, tmp_path: Path
) -> None:
    proc = services.start("quiet")
    await services.wait_live("quiet")
    task_dir = limits_task(tmp_path, base_image, Limits(memory_mb=256))
    async with RemoteEnvironments(url=services.url, run_id="silent", token="t") as envs:
        async with envs.sandbox(envs.task(str(task_dir)), episode_id="e") as sb:
            assert (await sb.exec("echo up")).stdout == "up\n"
            listed = cli("sandbox", "ls", "--url", services.url, "--format", "json")
            assert json.loads(listed)["sandbox"] == sb.id[:12]
            stats = json.loads(cli("sandbox", "stats", "--url", services.url, "--format", "json"))
            assert stats["sandbox"] == sb.id[:12] and stats["memory_mb"] > 0
            pending = asyncio.create_task(sb.exec("sleep 60", timeout=120))
            await asyncio.sleep(0.5)
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(InfraFailure) as failure:
                    await pending
            finally:
                os.kill(proc.pid, signal.SIGCONT)
    assert failure.value.kind == FailureKind.SANDBOX_HOST_LOST
    assert "no heartbeat" in failure.value.message


async def test_a_run_s_requests_need_its_token(base_image: str, tmp_path: Path) -> None:
    from stacx.sandbox.remote_wire import run_token

    task_dir = limits_task(tmp_path, base_image, Limits(memory_mb=256))
    async with (
        EmbeddedNats(tmp_path / "nats") as server,
        serving(server.url, tmp_path / "svc", "tok"),
        RemoteEnvironments(url=server.url, run_id="r", token=run_token("r")) as owner,
        RemoteEnvironments(url=server.url, run_id="r", token=run_token("r")) as intruder,
    ):
        task = owner.task(str(task_dir))
        async with owner.sandbox(task, episode_id="e"):
            with pytest.raises(ConfigError, match="bad token for run 'r'"):
                async with intruder.sandbox(task, episode_id="x"):
                    pass


def test_eval_set_rejects_an_unknown_backend_naming_the_accepted_ones(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            stacx_bin(),
            "eval",
            "--agent",
            "oracle",
            "--limit",
            "1",
            "--set",
            "sandbox.backend=rmote",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "sandbox.backend" in out.stderr and "'remote'" in out.stderr
    assert not (tmp_path / "r").exists()  # rejected at load, before anything started


def test_remote_backend_without_a_nats_url_is_refused_before_the_run_starts(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STACX_NATS_URL"}
    out = subprocess.run(
        [
            stacx_bin(),
            "eval",
            "--agent",
            "oracle",
            "--limit",
            "1",
            "--set",
            "sandbox.backend=remote",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 2
    assert "needs sandbox.url or STACX_NATS_URL" in out.stderr
    assert not (tmp_path / "r").exists()
