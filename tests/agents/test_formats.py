"""Action formats: the prefilled ```bash block (what a 135M model can write) and tool calls."""

from __future__ import annotations

import pytest

from stacx.agents.chat import ChatFormat
from stacx.agents.formats import BashBlockFormat, CallFormat, get_format
from stacx.errors import ConfigError
from stacx.toolcalls import MalformedCall, ToolCall


def test_bash_block_parse_takes_the_command_up_to_the_fence() -> None:
    fmt = BashBlockFormat()
    assert fmt.parse("mkdir -p /app/out\n```\nmore chatter") == ToolCall(
        name="bash", arguments={"command": "mkdir -p /app/out"}
    )
    # cut at the token budget: the block is unterminated, the command is what was written
    assert fmt.parse("echo hi > /app/x\necho") == ToolCall(
        name="bash", arguments={"command": "echo hi > /app/x\necho"}
    )
    assert fmt.parse(" submit \n```") == ToolCall(name="submit")
    assert isinstance(fmt.parse("\n```"), MalformedCall)


def test_bash_block_render_is_parse_inverse() -> None:
    fmt = BashBlockFormat()
    for name, args in (("bash", {"command": "cd /app\nwc -l < a > b"}), ("submit", {})):
        assert fmt.parse(fmt.render(name, args)) == ToolCall(name=name, arguments=args)
    with pytest.raises(ValueError, match="only the bash and submit"):
        fmt.render("view", {"path": "/"})


def test_stop_ids_add_the_fence_token(chat: ChatFormat) -> None:
    (fence,) = chat.content_ids("```")
    assert fence in BashBlockFormat().stop_token_ids(chat)
    assert set(chat.stop_token_ids) < set(BashBlockFormat().stop_token_ids(chat))
    assert CallFormat().stop_token_ids(chat) == sorted(chat.stop_token_ids)


def test_unknown_format_names_the_accepted_values() -> None:
    assert get_format("bash").name == "bash"
    with pytest.raises(ConfigError, match=r"agent\.format = 'json': accepted values are tool_call"):
        get_format("json")


def test_oracle_demonstration_drops_the_script_header_only() -> None:
    from stacx.agents.policies import script_body

    solve = "#!/bin/bash\n# Oracle: runs in /app.\n\nset -e\ncat > /app/a.py <<'EOF'\n# kept\nEOF\n"
    assert script_body(solve) == "set -e\ncat > /app/a.py <<'EOF'\n# kept\nEOF\n"
    assert script_body("echo hi") == "echo hi"
