"""`stacx tasks check DIR --agent oracle` on tasks as other people write Compose files
(tests/harbor/fixtures/compose-forms): a compose task with the short list form of depends_on,
interpolation and string commands loads and scores; a task whose compose file is not valid
Compose fails alone as task_invalid with the schema's message; a plain task scores 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import FIXTURES, stacx

pytestmark = pytest.mark.docker


def test_compose_forms_load_and_an_invalid_file_fails_alone(
    tmp_path: Path, base_images: object
) -> None:
    done = stacx(
        "tasks",
        "check",
        FIXTURES / "compose-forms",
        "--agent",
        "oracle",
        "--run-dir",
        tmp_path / "run",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # one task does not load
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 3}
    assert "ok" in lines["compose-short-depends"] and "│ 1 " in lines["compose-short-depends"]
    assert "ok" in lines["plain"] and "│ 1 " in lines["plain"]
    assert "FAIL" in lines["compose-invalid"] and "task_invalid" in lines["compose-invalid"]
    # the schema's message, with the key path in the file and what was expected
    assert (
        "compose-invalid: cannot be loaded: docker-compose.yaml: services.main.depends_on: "
        "'web' is not valid; expected a list or a mapping (Compose specification)"
    ) in out
    assert "oracle: 2/3 ok" in out
