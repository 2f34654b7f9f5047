"""Installed (black-box) scaffolds: a third-party agent program run unmodified in (or beside) the
task's container, calling the model through the gateway, which records its turns. Its only way out
is the gateway's socket (and the exec relay); a scaffold that fails before its first model call is
an InfraFailure, never scored; every exit is recorded.

Design: docs/scaffolds.md#how-an-installed-scaffold-runs
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import msgspec

from stacx.agents.exec_relay import ExecRelay
from stacx.agents.scaffold_spec import LOGS_DIR, ScaffoldSpec
from stacx.events import Emit, FailureKind, ScaffoldExited, StopReason, derive_id
from stacx.ports import Agent, AgentResult, InfraFailure, MakeAgent, Sandbox, Task

DEFAULT_TIMEOUT_S = 600.0  # {timeout} for a task that names no agent timeout
SOCKET_DIR = "/run/stacx"  # the gateway's socket directory, mounted into the container
SOCKET = f"{SOCKET_DIR}/gateway.sock"
FORWARD_PORT = 8377
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


class InstalledConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The recipe's [agent] settings an installed scaffold is given."""

    max_turns: int = 4
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    timeout_s: float | None = None  # the run template's {timeout}; None: the task's agent timeout


class GatewayRoute(Protocol):
    """One episode's route through the model gateway (stacx.inference.gateway.GatewayEpisode)."""

    credential: str
    n_turns: int
    n_calls: int
    transcript_ids: list[int]


class ModelGateway(Protocol):
    """The model gateway, as an installed agent needs it (stacx.inference.gateway.Gateway)."""

    model_name: str

    def episode(
        self, *, run_id: str, episode_id: str, emit: Emit
    ) -> AbstractAsyncContextManager[GatewayRoute]: ...


class BesideContainers(Protocol):
    """Where a `beside` scaffold runs: its own container per episode, and the exec relay."""

    relay: ExecRelay

    def sandbox(self, episode_id: str) -> AbstractAsyncContextManager[Sandbox]: ...


class InstalledAgent:
    """The `Agent` port over one installed scaffold."""

    def __init__(
        self,
        *,
        spec: ScaffoldSpec,
        gateway: ModelGateway,
        config: InstalledConfig,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        beside: BesideContainers | None = None,
    ) -> None:
        self.spec, self.gateway, self.config, self.timeout_s = spec, gateway, config, timeout_s
        self.beside = beside

    def command(self, route: GatewayRoute, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        """The shell command of one episode: the forwarder, then the scaffold."""
        c, q = self.config, shlex.quote
        root = f"http://127.0.0.1:{FORWARD_PORT}"  # Anthropic's clients add /v1/messages
        run = self.spec.run.format(
            instruction_file=q(f"{WORK_DIR}/instruction.md"),
            model=q(self.gateway.model_name),
            base_url=q(root if self.spec.api == "anthropic-messages" else f"{root}/v1"),
            api_key=q(route.credential),
            max_turns=c.max_turns,
            temperature=c.temperature,
            top_p=c.top_p,
            max_tokens=c.max_new_tokens,
            timeout=int(c.timeout_s or timeout_s),
            logs_dir=q(LOGS_DIR),
            venv=q(self.spec.venv),
        )
        fwd = f"{q(self.spec.interpreter())} {WORK_DIR}/forward.py {SOCKET} {FORWARD_PORT}"
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
        async with (
            self.gateway.episode(run_id=run_id, episode_id=episode_id, emit=emit) as route,
            self._where(episode_id, route, sandbox) as where,
        ):
            await where.write_file(f"{WORK_DIR}/instruction.md", instruction)
            await where.write_file(f"{WORK_DIR}/forward.py", FORWARDER)
            for path, text in self.spec.run_files().items():
                await where.write_file(path, text)

            async def exited(exit_code: int | None, timed_out: bool) -> str:
                stderr = await _tail(where, f"{LOGS_DIR}/stderr.txt")
                await emit(
                    ScaffoldExited(
                        run_id=run_id,
                        event_id=derive_id(episode_id, "scaffold_exited"),
                        episode_id=episode_id,
                        scaffold=self.spec.name,
                        exit_code=exit_code,
                        timed_out=timed_out,
                        stderr_tail=stderr,
                    )
                )
                return stderr

            try:
                done = await where.exec(
                    self.command(route, self.timeout_s), env=self.spec.run_env()
                )
            except asyncio.CancelledError:  # the episode's timeout: record what it left, then go
                await asyncio.shield(exited(None, True))
                raise
            stderr = await exited(done.exit_code, done.timed_out)
            if done.exit_code not in (0, None) and not done.timed_out and route.n_turns == 0:
                raise _crashed(self.spec.name, done.exit_code, stderr, route.n_calls)
            stop = await self._stop_reason(where)
            return AgentResult(
                stop_reason=stop,
                n_turns=route.n_turns,
                transcript_ids=list(route.transcript_ids),
            )

    @contextlib.asynccontextmanager
    async def _where(
        self, episode_id: str, route: GatewayRoute, sandbox: Sandbox
    ) -> AsyncIterator[Sandbox]:
        """The task's sandbox, or (`beside`) a container of its own using the exec relay."""
        if self.beside is None:
            yield sandbox
            return
        with self.beside.relay.register(route.credential, sandbox):
            async with self.beside.sandbox(episode_id) as own:
                yield own

    async def _stop_reason(self, sandbox: Sandbox) -> StopReason:
        """From the scaffold's trajectory: its info.exit_status, through `spec.stops`."""
        try:
            info = json.loads(await sandbox.read_file(self.spec.trajectory)).get("info", {})
        except (OSError, ValueError, AttributeError):
            return StopReason.AGENT_DONE
        status = str(info.get("exit_status", "")) if isinstance(info, dict) else ""
        return self.spec.stops.get(status, StopReason.AGENT_DONE)


def _crashed(scaffold: str, exit_code: int | None, stderr: str, calls: int) -> InfraFailure:
    """Exited non-zero before any model call was answered (127..., or a client that gave up on
    its first call): a SCAFFOLD failure, not a 0. The message says which of the two it was."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = f": {lines[-1].strip()}" if lines else " (no stderr)"
    when = (
        "before its first model call"
        if not calls
        else f"before any of its {calls} model call(s) was answered"
    )
    return InfraFailure(
        FailureKind.SCAFFOLD, f"scaffold {scaffold} exited with code {exit_code} {when}{last}"
    )


STDERR_TAIL = 4000  # characters of a scaffold's stderr kept in its ScaffoldExited event


async def _tail(sandbox: Sandbox, path: str) -> str:
    """The last STDERR_TAIL characters of a file in the sandbox ("" when it is not there)."""
    try:
        data = await sandbox.read_file(path)
    except OSError:
        return ""
    return data[-4 * STDERR_TAIL :].decode(errors="replace")[-STDERR_TAIL:]


def installed_agents(
    spec: ScaffoldSpec,
    gateway: ModelGateway,
    config: InstalledConfig,
    beside: BesideContainers | None = None,
) -> MakeAgent:
    """The rollout manager's agent factory for one scaffold (`beside`: for a spec that has one)."""

    def make(task: Task, sample_index: int) -> Agent:
        timeout = task.config.agent.timeout_sec or DEFAULT_TIMEOUT_S
        return InstalledAgent(
            spec=spec, gateway=gateway, config=config, timeout_s=timeout, beside=beside
        )

    return make
