"""The retool agent in a recipe: what cross_check accepts and rejects, and how roles wire it."""

from __future__ import annotations

import pytest

from stacx.agents.retool import RetoolTools
from stacx.errors import ConfigError
from stacx.events import RollIn
from stacx.launch.loader import convert
from stacx.launch.roles import agent_config, rollout_config


def test_retool_recipe_maps_onto_the_agent_and_a_student_policy() -> None:
    r = convert({"name": "x", "agent": {"name": "retool", "format": "python", "max_turns": 3}})
    config = agent_config(r)
    assert isinstance(config.tools, RetoolTools) and config.max_turns == 3
    assert config.tools.style == "python"
    assert rollout_config(r).policy == RollIn.STUDENT and rollout_config(r).agent == "retool"
    default = agent_config(convert({"name": "x", "agent": {"name": "retool"}})).tools
    assert isinstance(default, RetoolTools) and default.style == "tool_call"


@pytest.mark.parametrize(
    ("agent", "algorithm", "key"),
    [
        ({"name": "retool", "format": "bash"}, "grpo", "agent.format = 'bash'"),
        ({"name": "swe", "format": "python"}, "grpo", "agent.format = 'python'"),
        ({"name": "retool"}, "dagger", "agent.name = 'retool'"),
    ],
)
def test_unsupported_retool_combinations_fail_at_load(
    agent: dict[str, object], algorithm: str, key: str
) -> None:
    data = {"name": "x", "agent": agent, "algorithm": {"name": algorithm}}
    data["teacher"] = {"path": "/t"}
    with pytest.raises(ConfigError, match=key):
        convert(data)
