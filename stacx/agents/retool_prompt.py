"""The ReTool agent's texts: system prompt, task message, and what it says between turns."""

from __future__ import annotations

from stacx.toolcalls import render_tool_call

FENCE = "```"

# Worked examples teach a small model the shape of a reply better than rules do: one answered
# at once, one through Python. Neither problem is in a bundled set.
_DIRECT = ("What is 2 + 2?", "2 + 2 = 4. The answer is \\boxed{4}.")
_EXAMPLE_PROBLEM = "What is 17 * 23 + 5?"
_EXAMPLE_CODE = "print(17 * 23 + 5)"


def system_prompt(style: str = "python") -> str:
    """The system prompt for `style`: "python" (fenced blocks) or "tool_call" (a python call)."""
    if style == "tool_call":
        run = render_tool_call("python", {"code": _EXAMPLE_CODE})
        how = "To run Python, write exactly one call such as:\n" + run
    else:
        run = f"{FENCE}python\n{_EXAMPLE_CODE}\n{FENCE}"
        how = "To run Python, write one block such as:\n" + run
    return (
        "You are a careful math solver. Think step by step. You may run Python to compute: "
        f"{how}\n"
        "Its printed output comes back in the next message. When you know the result, reply "
        "with the final answer in \\boxed{}.\n\n"
        f"Example 1:\nProblem: {_DIRECT[0]}\nassistant: {_DIRECT[1]}\n\n"
        f"Example 2:\nProblem: {_EXAMPLE_PROBLEM}\nassistant: {run}\n"
        f"user: {output_message('396')}\n"
        "assistant: 17 * 23 + 5 = 396. The answer is \\boxed{396}."
    )


def task_message(problem: str) -> str:
    return f"Problem: {problem.strip()}"


def output_message(body: str) -> str:
    """The interpreter's output as the model sees it, with the reminder of how to finish."""
    return f"{FENCE}output\n{body}\n{FENCE}\n{AFTER_OUTPUT}"


AFTER_OUTPUT = "If this answers the problem, reply with the final answer in \\boxed{}."

NO_ACTION = (
    "Your message held neither Python code nor a final answer. Run Python in a "
    f"{FENCE}python block, or give the final answer as \\boxed{{...}}."
)

EMPTY_CODE = "The Python block is empty."
