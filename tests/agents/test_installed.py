"""Installed scaffolds, for real: mini-swe-agent from PyPI in a task container on network=none,
SmolLM2 behind the model gateway, through the front door (`stacx run`), then one SFT step on
the recorded calls; and the container's isolation (the gateway socket is its only way out)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from stacx.agents.installed import FORWARD_PORT, FORWARDER, SOCKET, SOCKET_DIR
from stacx.agents.scaffold_spec import resolve
from stacx.harbor.tasks import load_task
from stacx.inference.gateway import Gateway, serve_unix
from stacx.sandbox.environments import DockerEnvironments
from stacx.sandbox.images import bootstrap_base_image
from stacx.sandbox.layers import ImageLayer
from stacx.store import db
from tests.agents.conftest import trained_sequences

pytestmark = [pytest.mark.docker, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "recipes/tasks/basic/create-hello-file"

PROBE = """
import json, socket, urllib.request
out = {}
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
out["host_port"] = tcp("HOST", PORT)
out["docker0"] = tcp("172.17.0.1", PORT)
out["pypi_ip"] = tcp("151.101.0.223", 443)
try:
    socket.getaddrinfo("pypi.org", 443)
    out["dns"] = "resolved"
except OSError as e:
    out["dns"] = type(e).__name__
with urllib.request.urlopen("http://127.0.0.1:FWD/v1/models", timeout=10) as r:
    out["gateway"] = json.load(r)["data"][0]["id"]
print(json.dumps(out))
"""


def host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


async def test_the_container_reaches_the_gateway_and_nothing_else(tmp_path: Path) -> None:
    from stacx.inference.torch_engine import TorchEngine

    bootstrap_base_image()
    engine = await asyncio.to_thread(TorchEngine, "default", device="cpu", max_len=1024, threads=1)
    gateway = Gateway(engine, engine.tokenizer, model_name="student")  # type: ignore[arg-type]
    listener = await asyncio.start_server(lambda r, w: w.close(), "0.0.0.0", 0)
    port = listener.sockets[0].getsockname()[1]
    sock_dir = tempfile.mkdtemp(prefix="stacx-gw-test-")
    os.chmod(sock_dir, 0o755)
    mini = resolve("mini-swe-agent")
    layer = ImageLayer(name=mini.name, run=mini.layer_commands(), mounts={sock_dir: SOCKET_DIR})
    try:
        async with serve_unix(gateway, os.path.join(sock_dir, "gateway.sock")):
            async with DockerEnvironments(run_id="isolation", layer=layer) as envs:
                task = load_task(str(TASK))
                async with envs.sandbox(task, episode_id="e") as sandbox:
                    await sandbox.write_file("/tmp/fwd.py", FORWARDER)
                    await sandbox.write_file(
                        "/tmp/probe.py",
                        PROBE.replace("HOST", host_ip())
                        .replace("FWD", str(FORWARD_PORT))
                        .replace("PORT", str(port)),
                    )
                    py = mini.interpreter()
                    res = await sandbox.exec(
                        f"{py} /tmp/fwd.py {SOCKET} {FORWARD_PORT} > /tmp/fwd.log & "
                        "until grep -q ready /tmp/fwd.log; do sleep 0.05; done; "
                        f"{py} /tmp/probe.py",
                        timeout=60,
                    )
    finally:
        listener.close()
        await engine.close()
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["gateway"] == "student"  # through the forwarder and the mounted socket
    # network=none: no route to the host's other ports, nor to the registries, nor DNS
    assert out["host_port"] != "connected" and out["docker0"] != "connected"
    assert out["pypi_ip"] != "connected" and out["dns"] != "resolved"


def test_a_mini_swe_agent_episode_is_recorded_and_trained_on(tmp_path: Path) -> None:
    """One episode of the unmodified scaffold; its calls are the gateway's TurnGenerated (exact
    ids, logprobs, weight version), the verifier scores it, and one SFT step trains on it."""
    bootstrap_base_image()
    sets = [
        "tasks.include=['create-hello-file']",
        "tasks.per_iteration=1",
        "tasks.group_size=1",
        "agent.max_turns=1",
        "agent.max_new_tokens=16",
        "trainer.batch_episodes=1",
        "trainer.steps=1",
        r"trainer.trainable='^model\.norm\.weight$'",
        "logging.progress='plain'",
        "logging.plot=false",
        "eval={}",
    ]
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "run",
            str(ROOT / "recipes/scaffold/sft_tiny.toml"),
            "--run-dir",
            str(run_dir),
            "--quiet",
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    turns = con.execute(
        "select engine, len(prompt_ids), len(output_ids), len(logprobs), weight_version, "
        "request_json from turn_generated"
    ).fetchall()
    assert turns and all(t[0] == "gateway:torch" and t[2] > 0 and t[3] == t[2] for t in turns)
    assert all(t[4] == 0 for t in turns)  # generated before the first step
    # the request is mini-swe-agent's own: its system prompt and its bash tool
    request = json.loads(turns[0][5])
    assert request["tools"][0]["function"]["name"] == "bash"
    assert request["messages"][0]["content"].startswith("You are a helpful assistant")
    (status, reward, agent), *_ = con.execute(
        "select status, reward, agent from episodes"
    ).fetchall()
    assert status == "scored" and reward is not None and agent == "installed"
    ((n, ids),) = con.execute(
        "select n_samples, episode_ids from train_step_finished where step = 1"
    ).fetchall()
    episodes = [r[0] for r in con.execute("select episode_id from episodes").fetchall()]
    assert n >= 1 and list(ids) == episodes
    assert con.execute("select max(version) from weights").fetchone() == (1,)


@pytest.mark.parametrize(
    ("agent", "extra", "message"),
    [
        (
            {"scaffold": "nope"},
            {},
            "accepted: mini-swe-agent, openhands-sdk, terminus-2, or a path",
        ),
        ({"scaffold": "/nonexistent/x.toml"}, {}, "no such spec file"),
        ({}, {"sandbox": {"backend": "process"}}, "use 'docker'"),
        (
            {},
            {"algorithm": {"name": "dagger"}, "teacher": {"path": "t"}},
            "accepted: sft, grpo, rloo, eval",
        ),
        ({"format": "bash"}, {}, "not used by an installed scaffold"),
    ],
)
def test_what_an_installed_scaffold_does_not_honour_fails_at_load(
    agent: dict[str, object], extra: dict[str, object], message: str
) -> None:
    from stacx.errors import ConfigError
    from stacx.launch.loader import convert

    raw = {"name": "x", "agent": {"name": "installed", "scaffold": "mini-swe-agent", **agent}}
    with pytest.raises(ConfigError, match=message):
        convert({**raw, **extra}, source="test")


def test_a_scaffold_named_for_another_agent_fails_at_load() -> None:
    from stacx.errors import ConfigError
    from stacx.launch.loader import convert

    with pytest.raises(ConfigError, match=r"used by agent\.name = 'installed' only"):
        convert({"name": "x", "agent": {"name": "swe", "scaffold": "mini-swe-agent"}}, source="t")


@pytest.mark.slow  # a first run builds harbor's image (~3-8 min here); later runs reuse it
def test_a_terminus_2_episode_beside_a_basic_task(tmp_path: Path) -> None:
    """Terminus-2 from the `harbor` package, run beside the task's container as Harbor runs it
    (its own Python 3.13 container; its tmux session in the task's bookworm container through
    STACX's exec relay; its litellm calls to the gateway), through
    `stacx eval --agent installed:terminus-2` on a bundled task as it is (Python 3.11)."""
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            "installed:terminus-2",
            "--tasks",
            str(TASK.parent),
            "--include",
            TASK.name,
            # one of Terminus-2's episodes: the 135M model's replies are mostly cut at
            # max-new-tokens, and Terminus-2 re-asks each cut reply within the episode (a dozen
            # calls or more); a second episode adds its hand-off summary and another such chain
            "--max-turns",
            "1",
            "--max-new-tokens",
            "64",
            "--episode-timeout",
            # its first model call comes after harbor starts in its container and tmux in the
            # task's: ~20 s on the quiet 2-core machine, over 60 s when CI's workers load it
            "240",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    assert con.execute("select count(*) from turns where n_output_tokens > 0").fetchone()[0] > 0
    turns = con.execute("select len(output_ids), request_json from turn_generated").fetchall()
    assert turns and all(n > 0 for n, _ in turns)
    prompt = json.loads(turns[0][1])["messages"][0]["content"]
    # Terminus-2's own prompt, with the screen of its tmux session: in the task's container
    # (the task's WORKDIR /app), not in the scaffold's
    assert "Current Terminal Screen:" in prompt and ":/app#" in prompt
    # the 135M model rarely writes Terminus-2's JSON: mostly it re-asks until the episode's
    # timeout cuts it off (killed: no exit code); now and then Terminus-2 ends on its own (a
    # parse it accepts, or its own give-up). Either way the scaffold's end is recorded, and the
    # episode's stop reason agrees with the scaffold's exit.
    ((status, agent, stop),) = con.execute(
        "select status, agent, stop_reason from episodes"
    ).fetchall()
    assert (status, agent) == ("scored", "installed") and stop in ("agent_timeout", "agent_done")
    ((scaffold, code, timed_out, tail),) = con.execute(
        "select scaffold, exit_code, timed_out, stderr_tail from scaffold_exited"
    ).fetchall()
    assert scaffold == "terminus-2"
    if stop == "agent_timeout":
        assert (code, timed_out) == (None, True) and "LiteLLM" in tail
    else:  # it exited by itself, or its own command timeout ended it
        assert code is not None or timed_out


@pytest.mark.slow  # ~2 min once the SDK's layer is built (8 min on a loaded 2-core VM)
def test_an_openhands_condenser_rewrites_the_history_into_segments(tmp_path: Path) -> None:
    """The second scaffold, OpenHands' Software Agent SDK (Python >= 3.12, so a task on
    stacx/base:trixie), through `stacx eval --agent installed:...`, as a real scaffold that
    rewrites its history: the shipped OpenHands SDK spec with its
    summarizing condenser set to trigger early (a user's spec file extending it through [env]:
    more than 6 events; the user says "Go on." after each answer in words). The condenser's own
    call and the agent's call on the condensed history each open a new segment, and what the
    episode trains on is one sequence per segment, with the episode's outcome on every turn."""
    bootstrap_base_image(suite="trixie")
    tasks = tmp_path / "tasks"
    shutil.copytree(TASK, tasks / TASK.name)
    dockerfile = tasks / TASK.name / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("python:3.11-slim", "python:3.13-slim"))
    shipped = (ROOT / "stacx/agents/scaffolds/openhands-sdk.toml").read_text()
    spec = tmp_path / "openhands-condensing.toml"
    spec.write_text(
        shipped.replace(
            "[env]\n", '[env]\nSTACX_CONDENSER_MAX_SIZE = "6"\nSTACX_FOLLOW_UP = "Go on."\n'
        )
    )
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            f"installed:{spec}",
            "--tasks",
            str(tasks),
            "--max-turns",
            "4",
            "--max-new-tokens",
            "16",
            "--episode-timeout",
            "900",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    generated = con.execute("select engine, len(output_ids) from turn_generated").fetchall()
    assert generated and all(e == "gateway:torch" and n > 0 for e, n in generated)
    (status, agent), *_ = con.execute("select status, agent from episodes").fetchall()
    assert status == "scored" and agent == "installed"
    turns = con.execute(
        "select turn, segment, request_json from turn_generated order by turn"
    ).fetchall()
    messages = [json.loads(r)["messages"] for _, _, r in turns]
    first = json.loads(turns[0][2])  # the SDK's own system prompt and tools
    assert "OpenHands" in first["messages"][0]["content"][0]["text"]
    assert {"terminal", "file_editor"} <= {t["function"]["name"] for t in first["tools"]}
    segments = [s for _, s, _ in turns]
    # three calls on one growing history (instruction, then "Go on." twice): one segment
    assert segments[:3] == [0, 0, 0] and [len(m) for m in messages[:3]] == [2, 4, 6]
    # then the condenser's summary call (the events to forget, as its prompt) ...
    assert segments[3] == 1
    assert messages[3][-1]["content"][0]["text"].startswith("<EVENT>")
    # ... and the agent's call on the condensed history (the summary, then the next "Go on.")
    assert segments[4] == 2 and [m["role"] for m in messages[4]] == ["system", "user"]
    assert messages[4][-1]["content"][-1]["text"] == "Go on."
    # trained on: every turn, the episode's reward and one advantage on all; a sequence each
    grpo = con.execute("select turn, reward, advantage from grpo_batch order by turn").fetchall()
    ((reward,),) = con.execute("select reward from episodes").fetchall()
    assert [g[0] for g in grpo] == [t[0] for t in turns]
    assert {g[1] for g in grpo} == {reward} and len({g[2] for g in grpo}) == 1
    assert len(trained_sequences(con)) == len(set(segments))


CRASHING_SPEC = """\
name = "crashes-at-start"
run = \"\"\"python3 -c 'import sys; sys.stderr.write("usage: agent [-h] --task TASK\\\\nagent: error: unrecognized arguments: --bogus\\\\n"); sys.exit(2)'\"\"\"
"""
# its first call asks for 256 tokens (~100 ms each on CPU) and gives up after 5 s (no braces:
# the spec's placeholders)
IMPATIENT_SPEC = """\
name = "gives-up-on-its-call"
run = \'\'\'python3 -c '
import json, sys, urllib.request
url, key = sys.argv[1], sys.argv[2]
body = dict(model="m", messages=[dict(role="user", content="Count.")], max_tokens=256, ignore_eos=True)
head = dict(Authorization="Bearer " + key)
head["Content-Type"] = "application/json"
req = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(), head)
try:
    urllib.request.urlopen(req, timeout=5)
except OSError as e:
    sys.exit("agent: error: no reply in 5 s")
' {base_url} {api_key}\'\'\'
"""


@pytest.mark.parametrize(
    ("text", "name", "code", "last_line", "when"),
    [
        (
            CRASHING_SPEC,
            "crashes-at-start",
            2,
            "agent: error: unrecognized arguments: --bogus",
            "before its first model call",
        ),
        (
            IMPATIENT_SPEC,
            "gives-up-on-its-call",
            1,
            "agent: error: no reply in 5 s",
            "before any of its 1 model call(s) was answered",
        ),
    ],
    ids=["exits-at-start", "gives-up-on-its-first-call"],
)
def test_a_scaffold_that_exits_before_its_first_reply_is_a_scaffold_failure(
    tmp_path: Path, text: str, name: str, code: int, last_line: str, when: str
) -> None:
    """A user's spec whose `run` exits at once (an argparse error), or whose client gives up on
    its first call: never scored as 0, but InfraFailed 'scaffold' with its stderr and what it
    did (no call made, or calls made and none answered), in the eval report, on stderr, in
    `stacx sql`'s scaffold_failures and on the episode's page; `stacx eval` exits 1."""
    from stacx.view.episode import episode_page
    from stacx.view.source import Source

    spec = tmp_path / "crashes.toml"
    spec.write_text(text)
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            f"installed:{spec}",
            "--tasks",
            "basic",
            "--include",
            "create-hello-file",
            "--max-attempts",
            "1",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Scaffold failures" in proc.stdout and last_line in proc.stdout
    assert "the scaffold exited before any model call was answered in 1 episode(s)" in proc.stderr
    sql = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "sql",
            str(run_dir),
            "--format",
            "json",
            "select e.status, e.reward, e.failure_kind, f.scaffold, f.exit_code, f.stderr_last_line "
            "from episodes e join scaffold_failures f using (episode_id)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(sql.stdout) == {
        "status": "failed",
        "reward": None,
        "failure_kind": "scaffold",
        "scaffold": name,
        "exit_code": code,
        "stderr_last_line": last_line,
    }
    sql_cmd = [sys.executable, "-m", "stacx", "sql", str(run_dir), "--format", "json"]
    failed = subprocess.run(
        [*sql_cmd, "select message from infra_failed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"exited with code {code} {when}: {last_line}" in json.loads(failed.stdout)["message"]
    source = Source([run_dir])
    try:
        [(episode,)] = source.query("select episode_id from episodes").rows
        html = episode_page(source, {"id": str(episode)})
    finally:
        source.close()
    assert f"scaffold {name}: exit code {code}" in html
    assert last_line in html  # the stderr tail, not "No turns recorded." alone
