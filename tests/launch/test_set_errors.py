"""Errors point at their cause: a bad `--set` names the `--set` (not the recipe file), an error
in the file names the file, and a bad task set is reported before the resolved recipe is
printed (no plan dump above the error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stacx.errors import ConfigError
from stacx.launch.loader import load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "quickstart.toml"


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.lr=abc", "--set trainer.lr=abc: trainer.lr: Expected float, got str"),
        ("trainer.lrr=1", "--set trainer.lrr=1: unknown key trainer.lrr; accepted: "),
        ("trainer=3", "--set trainer=3: trainer: Expected object, got int"),
        (
            "algorithm.name=foo",
            "--set algorithm.name=foo: algorithm.name = 'foo': accepted values are 'sft'",
        ),
    ],
)
def test_a_bad_set_names_the_set(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(RECIPE, ["trainer.steps=2", override])
    assert str(info.value).startswith(message), info.value
    assert str(info.value).endswith(f"(recipe {RECIPE})")


def test_an_error_in_the_file_names_the_file_even_with_sets(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.read_text() + "\n[bogus]\nx = 1\n")
    with pytest.raises(ConfigError, match=rf"^{recipe}: unknown key bogus; accepted: "):
        load_recipe(recipe, ["trainer.lr=0.001"])


def test_a_missing_task_set_is_reported_before_the_plan_is_printed() -> None:
    from stacx.cli.run import cli

    result = CliRunner().invoke(
        cli, [str(RECIPE), "--set", "tasks.path=/no/such/tasks", "--dry-run"]
    )
    assert result.exit_code == 2, result.output
    assert "tasks.path '/no/such/tasks': no such file or directory" in result.output
    assert "resolved recipe" not in result.output and len(result.output.splitlines()) <= 2
