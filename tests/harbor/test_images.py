"""The base images' Debian mirror comes from the host's apt configuration (both formats)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.errors import SandboxError
from stacx.sandbox.images import bootstrap_base_image, host_mirrors


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    (d / "other.list.disabled").write_text("deb http://nope.example/ x main\n")
    assert host_mirrors((tmp_path / "sources.list", d)) == (
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    )


def test_mirror_from_one_line_sources(tmp_path: Path) -> None:
    f = tmp_path / "sources.list"
    f.write_text("# comment\ndeb [arch=amd64] http://local.mirror/debian bookworm main\n")
    assert host_mirrors((f,)) == ("http://local.mirror/debian", None)


def test_unknown_suite_names_the_accepted_ones() -> None:
    with pytest.raises(SandboxError, match="accepted: bookworm, trixie, noble"):
        bootstrap_base_image(suite="sid")


@pytest.mark.docker
def test_images_ls_says_which_bases_exist_and_what_maps_where(tmp_path: Path) -> None:
    from .conftest import stacx

    (tmp_path / "aliases.toml").write_text('"golang:*" = "stacx/base:bookworm"\n')
    out = stacx("images", "ls", "--aliases", tmp_path / "aliases.toml")
    assert out.returncode == 0, out.stderr
    rows = [
        [c.strip() for c in line.split("│")[1:-1]]
        for line in out.stdout.splitlines()
        if line.startswith("│")
    ]
    bases = {r[0]: r for r in rows if r[0].startswith("stacx/base:")}
    assert bases["stacx/base:noble"][1:3] == ["Ubuntu noble", "3.12"]
    assert bases["stacx/base:bookworm"][1:3] == ["Debian bookworm", "3.11"]
    assert ["golang:*", "stacx/base:bookworm", "yours"] in rows
    for pattern, base in (
        ("python:3.12*", "noble"),
        ("ubuntu:24.04*", "noble"),
        ("python:3.11*", "bookworm"),
        ("python:3.13*", "trixie"),
    ):
        assert [pattern, f"stacx/base:{base}", "default"] in rows


def test_heredocs_become_build_context_files() -> None:
    from stacx.sandbox.heredocs import expand_heredocs

    text = (
        "FROM x\nRUN <<EOF\necho a\nEOF\nRUN python3 - <<'PY' > /o\nprint(1)\nPY\n"
        "COPY <<-EOF /etc/c\n\tk=v\n\tEOF\n"
    )
    out, files = expand_heredocs(text)
    assert "<<" not in out and list(files.values()) == [b"echo a\n", b"print(1)\n", b"k=v\n"]
    assert "RUN (/bin/sh /.stacx-heredoc-0); rc=$?" in out
    assert "RUN (python3 - < /.stacx-heredoc-1 > /o)" in out
    assert "COPY .stacx-heredoc-2 /etc/c" in out


@pytest.mark.docker
async def test_buildkit_build_failure_keeps_its_log(tmp_path: Path, base_images: object) -> None:
    import aiodocker

    from stacx.errors import TaskError
    from stacx.harbor.tasks import load_task
    from stacx.sandbox.build import build_task_image

    (tmp_path / "environment").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "instruction.md").write_text("x\n")
    (tmp_path / "task.toml").write_text('schema_version = "1.4"\n')
    (tmp_path / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        "RUN --mount=type=cache,target=/root/.cache echo seen-before-failing && false\n"
    )
    async with aiodocker.Docker() as docker:
        with pytest.raises(TaskError, match=r"(?s)image build failed.*seen-before-failing"):
            await build_task_image(load_task(tmp_path), docker)
