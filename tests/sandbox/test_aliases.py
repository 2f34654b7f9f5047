"""The base-image alias map and FROM rewriting (pure: image existence is injected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.errors import ConfigError, TaskError
from stacx.sandbox.aliases import AliasMap, load_alias_file, normalize, rewrite_dockerfile
from stacx.sandbox.images import BASE_IMAGE, NOBLE_IMAGE, TRIXIE_IMAGE


def no_local_images(_image: str) -> bool:
    return False


@pytest.mark.parametrize(
    "image, expected",
    [
        ("ubuntu", "ubuntu:latest"),
        ("docker.io/library/python:3.11-slim", "python:3.11-slim"),
        ("python:3.12@sha256:" + "ab" * 32, "python:3.12"),
        ("index.docker.io/library/debian:bookworm-slim@sha256:00", "debian:bookworm-slim"),
        ("ghcr.io/org/img:1.0", "ghcr.io/org/img:1.0"),
        ("localhost:5000/img", "localhost:5000/img:latest"),
    ],
)
def test_normalize(image: str, expected: str) -> None:
    assert normalize(image) == expected


@pytest.mark.parametrize(
    "image",
    ["ubuntu:24.04", "python:3.12", "python:3.13", "python:3.11", "debian:trixie", "ubuntu:22.04"],
)
def test_resolution_never_depends_on_which_bases_exist(image: str) -> None:
    # what the host happened to build before must not change what a task runs on
    none, every = AliasMap(exists=no_local_images), AliasMap(exists=lambda _image: True)
    assert none.resolve(image) == every.resolve(image)
    assert none.fidelity(image) == every.fidelity(image)


def test_unresolvable_base_names_image_and_task() -> None:
    with pytest.raises(TaskError, match=r"task my-task: base image 'node:20'"):
        AliasMap(exists=no_local_images).resolve("node:20", task="my-task")


def test_a_local_image_resolves_to_itself() -> None:
    amap = AliasMap(exists=lambda image: image == "mycorp/tool:1")
    assert amap.resolve("mycorp/tool:1") == "mycorp/tool:1"


def test_user_file_wins_over_defaults(tmp_path: Path) -> None:
    f = tmp_path / "aliases.toml"
    f.write_text('[aliases]\n"ubuntu:24.04" = "my/ubuntu:local"\n"node:*" = "my/node:local"\n')
    amap = AliasMap(load_alias_file(f), exists=no_local_images)
    assert amap.resolve("ubuntu:24.04") == "my/ubuntu:local"
    assert amap.resolve("docker.io/library/node:20@sha256:" + "1" * 64) == "my/node:local"
    assert amap.resolve("ubuntu:22.04") == BASE_IMAGE  # defaults still apply


def test_alias_file_from_env_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "aliases.json"
    f.write_text('{"golang:*": "my/go:1"}')
    monkeypatch.setenv("STACX_IMAGE_ALIASES", str(f))
    assert AliasMap.from_env().lookup("golang:1.22") == "my/go:1"


def test_bad_alias_file_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "aliases.toml"
    f.write_text("ubuntu = 3\n")
    with pytest.raises(ConfigError, match=str(f)):
        load_alias_file(f)


def test_rewrite_dockerfile_stages_args_platform_and_scratch() -> None:
    text = (
        "ARG PY=3.11\n"
        "FROM --platform=linux/amd64 python:${PY}-slim AS build\n"
        "RUN echo hi\n"
        "FROM build AS test\n"
        "FROM scratch\n"
        "COPY --from=build /x /x\n"
        "from ubuntu:24.04\n"
    )
    out, bases = rewrite_dockerfile(text, AliasMap(exists=no_local_images), task="t")
    assert out.splitlines() == [
        "ARG PY=3.11",
        f"FROM --platform=linux/amd64 {BASE_IMAGE} AS build",
        # python:* images have /usr/local/bin/python, none has Debian's /usr/bin/python
        "RUN rm -f /usr/bin/python && ln -sf /usr/bin/python3 /usr/local/bin/python",
        "RUN echo hi",
        "FROM build AS test",
        "FROM scratch",
        "COPY --from=build /x /x",
        f"from {NOBLE_IMAGE}",
        "RUN rm -f /usr/bin/python",
        "",
        "WORKDIR /",  # the stand-in base's WORKDIR /app must not leak: ubuntu sets none
    ]
    assert bases == [BASE_IMAGE, NOBLE_IMAGE]


def test_registry_prefixes_digests_and_copy_from_images_are_mapped() -> None:
    digest = "@sha256:" + "0" * 64
    assert AliasMap().resolve(f"public.ecr.aws/docker/library/ubuntu:24.04{digest}") == NOBLE_IMAGE
    for image in ("mirror.gcr.io/library/debian:bookworm", "docker.io/library/python:3.11"):
        assert AliasMap(exists=no_local_images).resolve(image) == BASE_IMAGE, image
    text = "FROM ubuntu:22.04\nWORKDIR /app\nCOPY --from=python:3.11-slim /usr/bin/x /x\n"
    out, bases = rewrite_dockerfile(text, AliasMap(exists=no_local_images), task="t")
    assert f"COPY --from={BASE_IMAGE} /usr/bin/x /x" in out and bases == [BASE_IMAGE] * 2


def test_python_minor_picks_its_base_and_unfaithful_mappings_say_why() -> None:
    from stacx.sandbox.aliases import dockerfile_warnings
    from stacx.sandbox.images import TRIXIE_IMAGE

    amap = AliasMap(exists=no_local_images)
    assert amap.resolve("python:3.12-slim") == NOBLE_IMAGE
    assert amap.resolve("python:3.11") == BASE_IMAGE
    assert amap.resolve("python:3.13") == TRIXIE_IMAGE
    for faithful in ("python:3.11-slim", "python:3.12", "debian:trixie-slim", "ubuntu:24.04"):
        assert amap.fidelity(faithful) is None, faithful
    assert "Python 3.11" in str(amap.fidelity("python:3.10"))
    assert dockerfile_warnings("FROM ubuntu:22.04\n", amap) == [
        f"ubuntu:22.04 runs on {BASE_IMAGE} (Debian bookworm, not ubuntu: packages and "
        "versions differ)"
    ]
    assert amap.fidelity("ubuntu:jammy") == (
        f"ubuntu:jammy runs on {BASE_IMAGE} (Debian "
        "bookworm, not ubuntu: packages and versions differ)"
    )


def test_dockerfile_without_from_is_a_task_error() -> None:
    with pytest.raises(TaskError, match="no FROM"):
        rewrite_dockerfile("RUN true\n", AliasMap(exists=no_local_images), task="t")


def test_terminal_bench_bases_go_as_the_image_they_are_built_on() -> None:
    aliases = AliasMap(exists=lambda _image: True)
    ubuntu = "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
    python = "ghcr.io/laude-institute/t-bench/python-3-13:20250620@sha256:" + "0" * 64
    assert aliases.resolve(ubuntu) == NOBLE_IMAGE  # as ubuntu:24.04
    assert aliases.resolve(python) == TRIXIE_IMAGE  # Python 3.13, as on trixie
    assert aliases.fidelity(ubuntu) == (
        f"{ubuntu} runs on {NOBLE_IMAGE} without the tmux and asciinema it adds"
    )
    assert "without the tmux and asciinema" in str(aliases.fidelity(python))
    assert AliasMap({ubuntu: "mine:1"}, exists=lambda _i: True).resolve(ubuntu) == "mine:1"


# Real-world FROM lines -> the base they get, built or not (None: no alias, so a
# TaskError unless the engine has the image); the most specific pattern wins, whatever the order.
FROM_LINES = [
    ("python:3.12-slim-bookworm", NOBLE_IMAGE),  # the version beats the suite
    ("docker.io/library/python:3.12-slim-bookworm@sha256:" + "a" * 64, NOBLE_IMAGE),
    ("python:3.12-slim", NOBLE_IMAGE),
    ("python:3.12", NOBLE_IMAGE),
    ("python:3.13-slim-bookworm", TRIXIE_IMAGE),
    ("python:3.11-slim", BASE_IMAGE),
    ("python:3.11-slim-trixie", BASE_IMAGE),
    ("python:3.11.9-bookworm", BASE_IMAGE),
    ("python:3.10-slim-bullseye", BASE_IMAGE),
    ("python:3.9", BASE_IMAGE),
    ("python:3", TRIXIE_IMAGE),
    ("python:3-slim", TRIXIE_IMAGE),
    ("python:slim", TRIXIE_IMAGE),
    ("python", TRIXIE_IMAGE),
    ("mirror.gcr.io/library/python:3.14-slim", TRIXIE_IMAGE),
    ("ubuntu:22.04", BASE_IMAGE),
    ("ubuntu:20.04", BASE_IMAGE),
    ("ubuntu:jammy-20240227", BASE_IMAGE),
    ("ubuntu:24.04", NOBLE_IMAGE),
    ("public.ecr.aws/docker/library/ubuntu:noble", NOBLE_IMAGE),
    ("ubuntu", NOBLE_IMAGE),
    ("ubuntu:25.04", NOBLE_IMAGE),
    ("debian:bookworm-slim", BASE_IMAGE),
    ("debian:12", BASE_IMAGE),
    ("debian:trixie", TRIXIE_IMAGE),
    ("index.docker.io/library/debian:trixie-slim", TRIXIE_IMAGE),
    ("debian:13.1", TRIXIE_IMAGE),
    ("buildpack-deps:bookworm", BASE_IMAGE),
    ("node:20-bookworm", None),
    ("golang:1.22", None),
    ("ghcr.io/some-org/tool:1.0", None),
]


@pytest.mark.parametrize("image, expected", FROM_LINES)
def test_real_world_from_lines_get_the_most_specific_base(image: str, expected: str | None) -> None:
    both = AliasMap(exists=no_local_images)
    assert both.lookup(image) == expected
    if expected is None:
        with pytest.raises(TaskError, match="cannot be pulled here and has no alias"):
            both.resolve(image, task="t")
    else:
        assert both.resolve(image, task="t") == expected


def test_the_most_specific_user_pattern_wins_and_users_beat_defaults() -> None:
    amap = AliasMap(
        {"python:*bookworm*": "my/bookworm:1", "python:3.12*bookworm*": "my/312:1"},
        exists=lambda _tag: True,
    )
    assert amap.resolve("python:3.12-slim-bookworm") == "my/312:1"
    assert amap.resolve("python:3.11-bookworm") == "my/bookworm:1"
    assert amap.resolve("python:3.12-slim") == NOBLE_IMAGE  # no user pattern matches


def test_fidelity_names_the_python_and_the_debian_asked_for() -> None:
    both = AliasMap(exists=no_local_images)
    assert both.fidelity("python:3.12-slim-bookworm") == (
        "python:3.12-slim-bookworm runs on stacx/base:noble (Ubuntu noble, not bookworm)"
    )
    assert both.fidelity("python:3.14-slim") == (
        "python:3.14-slim asks for Python 3.14; it runs on stacx/base:trixie with Python 3.13 "
        "(code written for 3.14 may use what 3.13 lacks)"
    )
    assert both.fidelity("python:3.11-slim-bookworm") is None
    assert "Debian bookworm, not bullseye" in str(both.fidelity("python:3.10-bullseye"))
    assert "not alpine" in str(both.fidelity("python:3.13-alpine"))
