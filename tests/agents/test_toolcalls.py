"""Tool-call parsing: well-formed calls, the bash-fence fallback, and malformed input."""

from __future__ import annotations

import pytest

from stacx.agents.tools import truncate, validate
from stacx.toolcalls import (
    MalformedCall,
    ToolCall,
    parse_action,
    parse_tool_calls,
    render_tool_call,
)


def test_round_trip_of_rendered_call() -> None:
    args: dict[str, object] = {"command": "echo 'a \"b\"'\nls"}
    call = parse_action("Let me look.\n" + render_tool_call("bash", args))
    assert call == ToolCall(name="bash", arguments=args)


def test_unterminated_call_at_end_of_output_is_parsed() -> None:
    call = parse_action('<tool_call>{"name": "view", "arguments": {"path": "/app"}}')
    assert call == ToolCall(name="view", arguments={"path": "/app"})


def test_trailing_text_and_json_fence_are_tolerated() -> None:
    text = '<tool_call>\n```json\n{"name": "submit", "arguments": {}}\n```\n</tool_call> done'
    assert parse_action(text) == ToolCall(name="submit")
    text = '<tool_call>{"name": "submit", "arguments": {}} trailing words</tool_call>'
    assert parse_action(text) == ToolCall(name="submit")


def test_string_encoded_arguments_and_parameters_key() -> None:
    call = parse_action(
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>'
    )
    assert call == ToolCall(name="bash", arguments={"command": "pwd"})
    call = parse_action('<tool_call>{"name": "bash", "parameters": {"command": "pwd"}}</tool_call>')
    assert call == ToolCall(name="bash", arguments={"command": "pwd"})


def test_only_first_call_runs_and_the_rest_are_counted() -> None:
    one = render_tool_call("bash", {"command": "ls"})
    call = parse_action(one + one + one)
    assert isinstance(call, ToolCall) and call.extra_calls == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', "not valid JSON"),
        ("<tool_call>bash ls</tool_call>", "JSON object"),
        ("<tool_call></tool_call>", "empty"),
        ('<tool_call>["bash"]</tool_call>', "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', '"arguments"'),
        ('<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>', "not JSON"),
    ],
)
def test_malformed_calls_become_errors_for_the_model(text: str, needle: str) -> None:
    call = parse_action(text)
    assert isinstance(call, MalformedCall)
    assert needle in call.error


def test_bash_fence_is_a_bash_call_for_weak_models() -> None:
    assert parse_action("I will run:\n```bash\ncat /app/x.py\n```\n") == ToolCall(
        name="bash", arguments={"command": "cat /app/x.py"}
    )
    # unterminated fence (output cut by max_new_tokens)
    assert parse_action("```sh\nls -la /app\n") == ToolCall(
        name="bash", arguments={"command": "ls -la /app"}
    )
    assert isinstance(parse_action("```bash\n\n```"), MalformedCall)


def test_plain_prose_holds_no_call() -> None:
    assert parse_action("I think the answer is 42.") is None
    assert parse_action("```python\nprint(1)\n```") is None


@pytest.mark.parametrize(
    ("name", "args", "needle"),
    [
        ("rm", {}, "Unknown tool"),
        ("bash", {}, "needs the argument 'command'"),
        ("bash", {"command": 3}, "must be a str"),
        ("bash", {"command": "ls", "timeout": True}, "must be a int"),
        ("view", {"path": "/a", "colour": "red"}, "no argument 'colour'"),
    ],
)
def test_validation_names_the_problem(name: str, args: dict[str, object], needle: str) -> None:
    assert needle in validate(ToolCall(name=name, arguments=args))


def test_valid_calls_pass_validation() -> None:
    assert validate(ToolCall(name="bash", arguments={"command": "ls", "timeout": 5})) == ""
    assert validate(ToolCall(name="submit")) == ""


def test_truncation_is_visible_and_bounded() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    out, cut = truncate(text, 1000)
    assert cut
    assert out.startswith("HEAD") and out.endswith("TAIL")
    assert "[... 9008 bytes truncated ...]" in out
    assert len(out.encode()) < 1100
    assert truncate("short", 1000) == ("short", False)


def test_truncation_never_splits_a_multibyte_character() -> None:
    out, cut = truncate("é" * 3000, 101)
    assert cut
    out.encode("utf-8")  # would raise on a lone surrogate; decode used errors="ignore"
    head, _, _ = out.partition("\n[...")
    assert set(head) == {"é"}


def test_parse_tool_calls_returns_every_call_and_the_text_before_them() -> None:
    text = (
        "Let me look.\n"
        + render_tool_call("bash", {"command": "ls"})
        + "\n"
        + (render_tool_call("view", {"path": "a"}))
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [
        ("bash", {"command": "ls"}),
        ("view", {"path": "a"}),
    ]


def test_parse_tool_calls_keeps_a_reply_with_a_malformed_call_as_plain_text() -> None:
    text = render_tool_call("bash", {"command": "ls"}) + "<tool_call>{not json</tool_call>"
    assert parse_tool_calls(text) == (text, [])
    assert parse_tool_calls("```bash\nls\n```") == ("```bash\nls\n```", [])  # no fences here
