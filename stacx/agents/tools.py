"""The SWE agent's tools (bash, view, create, str_replace, submit) inside a Sandbox, and `ToolLog`,
which records any agent's calls. A bad call is an observation with `error` set, addressed to the
model; only the sandbox transport raises. Observations are cut to `max_bytes`, head and tail kept.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec

from stacx.events import Emit, ToolCalled, ToolReturned, derive_id
from stacx.ports import ExecResult, Sandbox
from stacx.toolcalls import ToolCall

SUBMIT = "submit"

# name -> (description for the prompt, {argument: (type, required)})
TOOL_SPECS: dict[str, tuple[str, dict[str, tuple[type, bool]]]] = {
    "bash": (
        "Run a shell command in the task's container (a fresh shell in the working directory "
        "each time); returns stdout, stderr and the exit code.",
        {"command": (str, True), "timeout": (int, False)},
    ),
    "view": (
        "Show a file with line numbers (optionally lines start_line..end_line), or list a directory.",
        {"path": (str, True), "start_line": (int, False), "end_line": (int, False)},
    ),
    "create": (
        "Create or overwrite a file with the given content.",
        {"path": (str, True), "content": (str, True)},
    ),
    "str_replace": (
        "Replace the one occurrence of old_str in a file with new_str.",
        {"path": (str, True), "old_str": (str, True), "new_str": (str, True)},
    ),
    SUBMIT: ("Finish: call this when the task is done. Takes no arguments.", {}),
}


class ToolLimits(msgspec.Struct, frozen=True, kw_only=True):
    bash_timeout_s: float = 60.0  # default per bash call
    max_timeout_s: float = 300.0  # cap on a timeout the model asks for
    max_bytes: int = 4096  # cap on one observation


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    output: str
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    error: str = ""
    submitted: bool = False
    duration_ms: float = 0.0


class ToolLog:
    """One episode's tool events: per turn at most one ToolCalled/ToolReturned pair, ids derived
    from (episode_id, turn), so a redo publishes the same events."""

    def __init__(self, run_id: str, episode_id: str, emit: Emit) -> None:
        self.run_id, self.episode_id, self.emit = run_id, episode_id, emit
        self.turn = 0

    async def called(self, tool: str, arguments: Mapping[str, object]) -> None:
        await self.emit(
            ToolCalled(
                run_id=self.run_id,
                event_id=derive_id(self.episode_id, "ToolCalled", self.turn),
                episode_id=self.episode_id,
                turn=self.turn,
                call_id=derive_id(self.episode_id, "call", self.turn),
                tool=tool,
                arguments_json=msgspec.json.encode(arguments).decode(),
            )
        )

    async def returned(self, tool: str, obs: Observation) -> None:
        await self.emit(
            ToolReturned(
                run_id=self.run_id,
                event_id=derive_id(self.episode_id, "ToolReturned", self.turn),
                episode_id=self.episode_id,
                turn=self.turn,
                call_id=derive_id(self.episode_id, "call", self.turn),
                tool=tool,
                output=obs.output,
                exit_code=obs.exit_code,
                timed_out=obs.timed_out,
                truncated=obs.truncated,
                error=obs.error,
                duration_ms=obs.duration_ms,
            )
        )


def truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    """Keep the head and tail of `text` within about `max_bytes` UTF-8 bytes, marking the cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text, False
    half = max(max_bytes // 2, 1)
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[-half:].decode("utf-8", errors="ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return f"{head}\n[... {cut} bytes truncated ...]\n{tail}", True


def validate(call: ToolCall) -> str:
    """An error message for the model if `call` does not fit its tool's spec, else ''."""
    spec = TOOL_SPECS.get(call.name)
    if spec is None:
        return f"Unknown tool {call.name!r}; the tools are: {', '.join(TOOL_SPECS)}."
    params = spec[1]
    for key, (typ, required) in params.items():
        if key not in call.arguments:
            if required:
                return f"Tool {call.name!r} needs the argument {key!r}."
            continue
        value = call.arguments[key]
        ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
        if not ok:
            return f"Argument {key!r} of {call.name!r} must be a {typ.__name__}."
    unknown = sorted(set(call.arguments) - set(params))
    if unknown:
        return f"Tool {call.name!r} takes no argument {unknown[0]!r}; it takes: {', '.join(params) or 'none'}."
    return ""


ToolRun = Callable[[Sandbox], Awaitable[Observation]]
"""A scripted action's own execution, run in place of its call's tool (the oracle's solve.sh)."""


async def execute(
    call: ToolCall, sandbox: Sandbox, limits: ToolLimits, run: ToolRun | None = None
) -> Observation:
    """Run one call (or a scripted action's `run`); only the transport raises; output is cut."""
    t0 = time.perf_counter()
    error = "" if run is not None else validate(call)
    if run is not None:
        obs = await run(sandbox)
    elif error:
        obs = Observation(output="", error=error)
    elif call.name == SUBMIT:
        obs = Observation(output="Submitted.", submitted=True)
    elif call.name == "bash":
        obs = await _bash(call.arguments, sandbox, limits)
    elif call.name == "view":
        obs = await _view(call.arguments, sandbox, limits)
    elif call.name == "create":
        obs = await _create(call.arguments, sandbox)
    else:
        obs = await _str_replace(call.arguments, sandbox)
    output, cut = truncate(obs.output, limits.max_bytes)
    return msgspec.structs.replace(
        obs,
        output=output,
        truncated=obs.truncated or cut,
        duration_ms=(time.perf_counter() - t0) * 1000,
    )


def render_observation(obs: Observation) -> str:
    """The text the model sees for one tool result."""
    if obs.error:
        return f"Error: {obs.error}"
    return obs.output


async def _bash(args: dict[str, object], sandbox: Sandbox, limits: ToolLimits) -> Observation:
    command = str(args["command"])
    asked = args.get("timeout")
    timeout = (
        min(float(asked), limits.max_timeout_s) if isinstance(asked, int) else limits.bash_timeout_s
    )
    res = await sandbox.exec(["bash", "-c", command], timeout=timeout)
    return bash_observation(res, timeout)


def bash_observation(res: ExecResult, timeout: float) -> Observation:
    """A shell command's result as the model sees it: stdout, stderr, how it ended, limits hit."""
    parts = [res.stdout]
    if res.stderr:
        parts.append(f"[stderr]\n{res.stderr}")
    if res.oom_killed:
        parts.append("[a process was killed: out of memory]")
    if res.pids_limited:
        parts.append("[a fork was refused: process limit]")
    if res.timed_out:
        parts.append(f"[timed out after {timeout:g} s]")
    else:
        parts.append(f"[exit code {res.exit_code}]")
    text = "\n".join(p.rstrip("\n") for p in parts if p)
    return Observation(
        output=text, exit_code=res.exit_code, timed_out=res.timed_out, truncated=res.truncated
    )


async def _view(args: dict[str, object], sandbox: Sandbox, limits: ToolLimits) -> Observation:
    path = shlex.quote(str(args["path"]))
    start = args.get("start_line", 1)
    end = args.get("end_line", "$")
    script = (
        f"if [ -d {path} ]; then find {path} -maxdepth 2 -not -path '*/.*' | sort | head -n 200; "
        f"elif [ -f {path} ]; then cat -n {path} | sed -n '{start},{end}p'; "
        f"else echo 'no such file or directory' >&2; exit 2; fi"
    )
    res = await sandbox.exec(["bash", "-c", script], timeout=limits.bash_timeout_s)
    if res.exit_code != 0:
        return Observation(output="", error=f"cannot view {args['path']}: {res.stderr.strip()}")
    return Observation(output=res.stdout, exit_code=0, truncated=res.truncated)


async def _create(args: dict[str, object], sandbox: Sandbox) -> Observation:
    path = str(args["path"])
    content = str(args["content"])
    parent = posixpath.dirname(path)
    if parent:
        res = await sandbox.exec(["mkdir", "-p", parent], timeout=30)
        if res.exit_code != 0:
            return Observation(output="", error=f"cannot create {parent}: {res.stderr.strip()}")
    await sandbox.write_file(path, content)
    return Observation(output=f"Wrote {len(content.encode())} bytes to {path}.")


async def _str_replace(args: dict[str, object], sandbox: Sandbox) -> Observation:
    path = str(args["path"])
    old, new = str(args["old_str"]), str(args["new_str"])
    probe = await sandbox.exec(["test", "-f", path], timeout=30)
    if probe.exit_code != 0:
        return Observation(output="", error=f"no such file: {path}")
    text = (await sandbox.read_file(path)).decode("utf-8", errors="replace")
    count = text.count(old) if old else 0
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        return Observation(
            output="", error=f"old_str {where} in {path}; it must occur exactly once."
        )
    await sandbox.write_file(path, text.replace(old, new, 1))
    return Observation(output=f"Replaced 1 occurrence in {path}.")


def tools_prompt() -> str:
    """The tool list as shown in the system prompt."""
    lines = []
    for name, (desc, params) in TOOL_SPECS.items():
        args = ", ".join(
            f"{k}: {t.__name__}{'' if req else ' (optional)'}" for k, (t, req) in params.items()
        )
        lines.append(f"- {name}({args}): {desc}")
    return "\n".join(lines)
