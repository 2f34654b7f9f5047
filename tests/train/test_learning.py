"""Learning on CPU, end to end through the log: the real engine samples (default model), a
verifier scores, the Trainer learns from the log, WeightSync loads each version into the engine,
and the reward by weight version (SQL, ``reward_by_weight_version``) goes up.

Driven by tools/learning_curve.py (the same code that produces the reported curves). To fit
the CPU budget the trainer updates the last decoder layer and the final norm only; sampling is
seeded, so a run is reproducible on one machine, and the asserted margins are far from noise
(the observed gains are about twice the margins).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "learning_curve.py"
PARTIAL = r"model\.norm|layers\.29\."


def learning_curve() -> ModuleType:
    spec = importlib.util.spec_from_file_location("learning_curve", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_grpo_raises_an_easy_reward(tmp_path: Path) -> None:
    lc = learning_curve()
    args = lc.parse(
        [
            "--run-dir",
            str(tmp_path / "run"),
            "--task",
            "short",
            "--iterations",
            "3",
            "--prompts",
            "2",
            "--samples",
            "8",
            "--max-new-tokens",
            "6",
            "--trainable",
            PARTIAL,
            "--lr",
            "1e-3",
        ]
    )
    result = await lc.main(args)
    assert result["versions"] == 3
    assert result["last"] >= result["first"] + 0.25, result


@pytest.mark.slow
async def test_sft_on_oracle_demonstrations_raises_the_reward(tmp_path: Path) -> None:
    lc = learning_curve()
    args = lc.parse(
        [
            "--run-dir",
            str(tmp_path / "run"),
            "--algorithm",
            "sft",
            "--task",
            "target",
            "--iterations",
            "3",
            "--prompts",
            "4",
            "--samples",
            "8",
            "--demos",
            "2",
            "--trainable",
            PARTIAL,
            "--lr",
            "1e-3",
        ]
    )
    result = await lc.main(args)
    assert result["last"] >= result["first"] + 0.2, result
