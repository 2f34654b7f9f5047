"""Installed (black-box) scaffolds: a third-party agent program from PyPI, run unmodified inside
the task's container, that speaks OpenAI to the model gateway.

A `ScaffoldSpec` says how: the install commands (run once as an image layer over the task
image, so an episode starts with the scaffold in place and no network), the run command
template, and where its trajectory lands. `InstalledAgent` is the `Agent` port over one: per
episode it opens a gateway route (a credential that attributes every call to the episode), writes
the instruction and the forwarder into the sandbox, and runs the scaffold there. The model's
turns are recorded by the gateway (`TurnGenerated` with the exact ids), not by this module.

Isolation: the container runs with network=none. Its only way out is the gateway's unix socket,
mounted at `SOCKET_DIR`; `FORWARDER` (stdlib Python, started next to the scaffold) listens on
127.0.0.1:`FORWARD_PORT` inside the container and relays each TCP connection to that socket, so
the scaffold's base URL is an ordinary http://127.0.0.1 one. Nothing else leaves the container
(tests/agents/test_installed.py checks that the host's ports and the registries are unreachable).

Shipped: `mini-swe-agent` (2.4.6, its `mini` CLI; any task image with Python 3) and
`openhands-sdk` (OpenHands' Software Agent SDK 1.58.2 with its terminal and file-editor tools,
started by a small driver since the SDK has no CLI; needs Python >= 3.12 in the task image, e.g. a
task on stacx/base:trixie: on bookworm's 3.11 the layer build fails, an IMAGE_BUILD failure).

Not here: building the layer and mounting the socket (stacx.sandbox.layers, wired by
stacx.launch), the gateway (stacx.inference.gateway). A scaffold that crashes ends its episode
with AGENT_DONE; its exit code and stderr tail are recorded (`ScaffoldExited`; the gateway's
error answers to its calls are `GatewayRefused`), its stdout/stderr stay in /logs/agent, and the
verifier scores what it left behind.
"""

from __future__ import annotations

import json
import shlex
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import msgspec

from stacx.errors import ConfigError
from stacx.events import Emit, ScaffoldExited, StopReason, derive_id
from stacx.ports import Agent, AgentResult, MakeAgent, Sandbox, Task

SOCKET_DIR = "/run/stacx"  # the gateway's socket directory, mounted into the container
SOCKET = f"{SOCKET_DIR}/gateway.sock"
FORWARD_PORT = 8377
LOGS_DIR = "/logs/agent"
WORK_DIR = "/tmp/stacx"  # the instruction and the forwarder, outside the task's own files

FORWARDER = """\
import asyncio, sys

SOCK, PORT = sys.argv[1], int(sys.argv[2])


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def handle(reader, writer):
    try:
        ureader, uwriter = await asyncio.open_unix_connection(SOCK)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, uwriter), pipe(ureader, writer))
    writer.close()
    uwriter.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
"""


class ScaffoldSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How one scaffold is installed and run.

    `run` is a shell command template; its fields are `{instruction_file}`, `{model}`,
    `{base_url}`, `{api_key}`, `{max_turns}`, `{temperature}`, `{top_p}`, `{max_tokens}` and
    `{logs_dir}`, each already shell-quoted. `python` runs the forwarder (an interpreter the
    install put in place). `trajectory` is where the scaffold writes its own record."""

    name: str
    version: str
    install: list[str]
    run: str
    python: str
    trajectory: str
    env: dict[str, str] = msgspec.field(default_factory=dict)
    files: dict[str, str] = msgspec.field(default_factory=dict)  # written before each run
    # the trajectory's info.exit_status -> the episode's stop reason (else AGENT_DONE)
    stops: dict[str, StopReason] = msgspec.field(default_factory=dict)


_MINI_VENV = "/opt/stacx-scaffold"
MINI_SWE_AGENT = ScaffoldSpec(
    name="mini-swe-agent",
    version="2.4.6",
    # a venv of its own: the task's Python and its packages stay as the task built them
    install=[
        f"python3 -m venv {_MINI_VENV}",
        f"{_MINI_VENV}/bin/pip install --no-cache-dir --disable-pip-version-check "
        "mini-swe-agent==2.4.6",
    ],
    run=(
        f'{_MINI_VENV}/bin/mini --yolo --exit-immediately --task "$(cat {{instruction_file}})" '
        "--model openai/{model} --config mini.yaml "
        "--config model.model_kwargs.api_base={base_url} "
        "--config model.model_kwargs.api_key={api_key} "
        "--config model.model_kwargs.temperature={temperature} "
        "--config model.model_kwargs.top_p={top_p} "
        "--config model.model_kwargs.max_tokens={max_tokens} "
        "--config agent.step_limit={max_turns} --config agent.cost_limit=0 "
        "--output {logs_dir}/trajectory.json"
    ),
    python=f"{_MINI_VENV}/bin/python",
    trajectory=f"{LOGS_DIR}/trajectory.json",
    stops={"Submitted": StopReason.SUBMITTED, "LimitsExceeded": StopReason.MAX_TURNS},
    env={
        "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
        "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": f"{WORK_DIR}/mswea",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm would fetch its price list at import
        "PAGER": "cat",
    },
)

# OpenHands' Software Agent SDK has no CLI of its own: this driver (Harbor's runner does the same)
# builds the SDK's Agent with its terminal and file-editor tools and runs one Conversation; the
# SDK itself is unmodified. Needs Python >= 3.12 in the task image (stacx/base:trixie tasks).
OPENHANDS_DRIVER = """\
import argparse, json, os, pathlib

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool

p = argparse.ArgumentParser()
for flag in ("instruction-file", "trajectory", "model", "base-url", "api-key", "max-turns",
             "temperature", "top-p", "max-tokens"):
    p.add_argument("--" + flag, required=True)
a = p.parse_args()
llm = LLM(model=a.model, base_url=a.base_url, api_key=a.api_key, temperature=float(a.temperature),
          top_p=float(a.top_p), max_output_tokens=int(a.max_tokens), reasoning_effort=None,
          num_retries=1, usage_id="stacx")
agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)])
conversation = Conversation(agent=agent, workspace=os.getcwd(), visualizer=None,
                            max_iteration_per_run=int(a.max_turns))
conversation.send_message(pathlib.Path(a.instruction_file).read_text())
status = "error"
try:
    conversation.run()
    status = str(getattr(conversation.state.execution_status, "value",
                         conversation.state.execution_status))
finally:
    events = []
    for event in conversation.state.events:
        try:
            events.append(event.model_dump(mode="json"))
        except Exception as exc:  # an event the SDK cannot serialize is kept as its repr
            events.append({"repr": repr(event), "error": str(exc)})
    pathlib.Path(a.trajectory).write_text(json.dumps({"info": {"exit_status": status},
                                                      "events": events}))
"""
_OH_VENV = "/opt/stacx-openhands"
OPENHANDS_SDK = ScaffoldSpec(
    name="openhands-sdk",
    version="1.58.2",
    install=[
        f"python3 -m venv {_OH_VENV}",
        f"{_OH_VENV}/bin/pip install --no-cache-dir --disable-pip-version-check "
        "openhands-sdk==1.58.2 openhands-tools==1.58.2",
    ],
    run=(
        f"{_OH_VENV}/bin/python {WORK_DIR}/openhands_run.py "
        "--instruction-file {instruction_file} --trajectory {logs_dir}/trajectory.json "
        "--model openai/{model} --base-url {base_url} --api-key {api_key} "
        "--max-turns {max_turns} --temperature {temperature} --top-p {top_p} "
        "--max-tokens {max_tokens}"
    ),
    python=f"{_OH_VENV}/bin/python",
    trajectory=f"{LOGS_DIR}/trajectory.json",
    files={f"{WORK_DIR}/openhands_run.py": OPENHANDS_DRIVER},
    stops={"finished": StopReason.SUBMITTED},
    env={
        "OPENHANDS_SUPPRESS_BANNER": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HOME": WORK_DIR,  # the SDK keeps its state under ~; /tmp/stacx exists by then
    },
)

SCAFFOLDS: dict[str, ScaffoldSpec] = {s.name: s for s in (MINI_SWE_AGENT, OPENHANDS_SDK)}


def scaffold(name: str) -> ScaffoldSpec:
    """The shipped spec called `name`; ConfigError naming the accepted ones."""
    try:
        return SCAFFOLDS[name]
    except KeyError:
        raise ConfigError(
            f"agent.scaffold = {name!r}: accepted: {', '.join(sorted(SCAFFOLDS))}"
        ) from None


class InstalledConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The recipe's [agent] settings an installed scaffold is given."""

    max_turns: int = 4
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0


class GatewayRoute(Protocol):
    """One episode's route through the model gateway (stacx.inference.gateway.GatewayEpisode)."""

    credential: str
    n_turns: int
    transcript_ids: list[int]


class ModelGateway(Protocol):
    """The model gateway, as an installed agent needs it (stacx.inference.gateway.Gateway)."""

    model_name: str

    def episode(
        self, *, run_id: str, episode_id: str, emit: Emit
    ) -> AbstractAsyncContextManager[GatewayRoute]: ...


class InstalledAgent:
    """The `Agent` port over one installed scaffold (see the module docstring)."""

    def __init__(
        self, *, spec: ScaffoldSpec, gateway: ModelGateway, config: InstalledConfig
    ) -> None:
        self.spec, self.gateway, self.config = spec, gateway, config

    def command(self, route: GatewayRoute) -> str:
        """The shell command of one episode: the forwarder, then the scaffold."""
        c, q = self.config, shlex.quote
        run = self.spec.run.format(
            instruction_file=q(f"{WORK_DIR}/instruction.md"),
            model=q(self.gateway.model_name),
            base_url=q(f"http://127.0.0.1:{FORWARD_PORT}/v1"),
            api_key=q(route.credential),
            max_turns=c.max_turns,
            temperature=c.temperature,
            top_p=c.top_p,
            max_tokens=c.max_new_tokens,
            logs_dir=q(LOGS_DIR),
        )
        fwd = f"{q(self.spec.python)} {WORK_DIR}/forward.py {SOCKET} {FORWARD_PORT}"
        return (
            f"mkdir -p {LOGS_DIR} && {fwd} > {LOGS_DIR}/forwarder.log 2>&1 & fwd=$!; "
            f"for _ in $(seq 100); do grep -q ready {LOGS_DIR}/forwarder.log && break; "
            "sleep 0.05; done; "
            f"{run} > {LOGS_DIR}/stdout.txt 2> {LOGS_DIR}/stderr.txt; rc=$?; "
            'kill "$fwd" 2>/dev/null; exit "$rc"'
        )

    async def run(
        self, *, run_id: str, episode_id: str, instruction: str, sandbox: Sandbox, emit: Emit
    ) -> AgentResult:
        async with self.gateway.episode(run_id=run_id, episode_id=episode_id, emit=emit) as route:
            await sandbox.write_file(f"{WORK_DIR}/instruction.md", instruction)
            await sandbox.write_file(f"{WORK_DIR}/forward.py", FORWARDER)
            for path, text in self.spec.files.items():
                await sandbox.write_file(path, text)
            done = await sandbox.exec(self.command(route), env=dict(self.spec.env))
            await emit(ScaffoldExited(
                run_id=run_id, event_id=derive_id(episode_id, "scaffold_exited"),
                episode_id=episode_id, scaffold=self.spec.name, exit_code=done.exit_code,
                timed_out=done.timed_out, stderr_tail=await _tail(sandbox, f"{LOGS_DIR}/stderr.txt"),
            ))  # fmt: skip
            stop = await self._stop_reason(sandbox)
            return AgentResult(
                stop_reason=stop,
                n_turns=route.n_turns,
                n_tool_calls=0,  # the scaffold's own actions are in its trajectory, not events
                transcript_ids=list(route.transcript_ids),
            )

    async def _stop_reason(self, sandbox: Sandbox) -> StopReason:
        """From the scaffold's trajectory: its info.exit_status, through `spec.stops`."""
        try:
            info = json.loads(await sandbox.read_file(self.spec.trajectory)).get("info", {})
        except (OSError, ValueError, AttributeError):
            return StopReason.AGENT_DONE
        status = str(info.get("exit_status", "")) if isinstance(info, dict) else ""
        return self.spec.stops.get(status, StopReason.AGENT_DONE)


STDERR_TAIL = 4000  # characters of a scaffold's stderr kept in its ScaffoldExited event


async def _tail(sandbox: Sandbox, path: str) -> str:
    """The last STDERR_TAIL characters of a file in the sandbox ("" when it is not there)."""
    try:
        data = await sandbox.read_file(path)
    except OSError:
        return ""
    return data[-4 * STDERR_TAIL :].decode(errors="replace")[-STDERR_TAIL:]


def installed_agents(
    spec: ScaffoldSpec, gateway: ModelGateway, config: InstalledConfig
) -> MakeAgent:
    """The rollout manager's agent factory for one scaffold."""

    def make(task: Task, sample_index: int) -> Agent:
        return InstalledAgent(spec=spec, gateway=gateway, config=config)

    return make
