"""Every form the Compose specification allows for the keys STACX honours, read as Compose
reads them (table-driven: a compose snippet -> the Service field it must give), and malformed
files refused with the schema's message (pure: no Docker)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stacx.errors import TaskError
from stacx.harbor.compose_load import duration_ns, interpolate
from stacx.sandbox.compose import load_compose

NS = 1_000_000_000


def _load(tmp_path: Path, web: str, extra: str = "") -> dict[str, object]:
    text = "services:\n  db:\n    image: postgres:16\n  web:\n    image: nginx\n" + web + extra
    (tmp_path / "docker-compose.yaml").write_text(text)
    services, _ = load_compose(tmp_path / "docker-compose.yaml")
    return {f: getattr(services["web"], f) for f in services["web"].__struct_fields__}


FORMS = [
    # depends_on: the short list form and the long map form
    ("    depends_on: [db]\n", "depends_on", {"db": "service_started"}),
    ("    depends_on:\n      - db\n", "depends_on", {"db": "service_started"}),
    (
        "    depends_on:\n      db:\n        condition: service_healthy\n",
        "depends_on",
        {"db": "service_healthy"},
    ),
    (
        "    depends_on:\n      db: {condition: service_completed_successfully, restart: true}\n",
        "depends_on",
        {"db": "service_completed_successfully"},
    ),
    (
        "    depends_on:\n      db: {condition: service_started}\n      cache: {condition: service_started, required: false}\n",
        "depends_on",
        {"db": "service_started"},
    ),
    # environment: a list (KEY=VAL, KEY alone takes the host's value) or a map
    (
        "    environment: [A=1, B=x=y, STACX_T_HOST, STACX_T_UNSET]\n",
        "environment",
        {"A": "1", "B": "x=y", "STACX_T_HOST": "from-host"},
    ),
    (
        "    environment:\n      A: 1\n      B: true\n      C: null\n      STACX_T_HOST:\n",
        "environment",
        {"A": "1", "B": "true", "STACX_T_HOST": "from-host"},
    ),
    # interpolation: ${VAR}, defaults for unset / empty, $$, nested, alternatives
    (
        "    environment:\n      A: ${STACX_T_HOST}\n      B: ${STACX_T_UNSET:-dflt}\n"
        "      C: ${STACX_T_EMPTY-kept}\n      D: ${STACX_T_EMPTY:-filled}\n      E: $$HOME\n"
        "      F: ${STACX_T_UNSET:-${STACX_T_HOST}}\n      G: ${STACX_T_HOST:+alt}\n"
        "      H: $STACX_T_HOST/x\n      I: ${STACX_T_UNSET-d}\n",
        "environment",
        {
            "A": "from-host",
            "B": "dflt",
            "C": "",
            "D": "filled",
            "E": "$HOME",
            "F": "from-host",
            "G": "alt",
            "H": "from-host/x",
            "I": "d",
        },
    ),
    # command / entrypoint: a string split as a shell would, or a list
    (
        "    command: python -m http.server 'a b'\n",
        "command",
        ["python", "-m", "http.server", "a b"],
    ),
    ("    command: [sh, -c, 'echo $$X']\n", "command", ["sh", "-c", "echo $X"]),
    ("    entrypoint: /bin/sh -c\n", "entrypoint", ["/bin/sh", "-c"]),
    ('    entrypoint: ["/entry.sh", "--flag"]\n', "entrypoint", ["/entry.sh", "--flag"]),
    # healthcheck: a string test is CMD-SHELL; CMD and CMD-SHELL lists; NONE / disable
    (
        "    healthcheck:\n      test: curl -f localhost\n      interval: 1m30s\n"
        "      timeout: 250ms\n      retries: 5\n      start_period: 1h\n",
        "healthcheck",
        {
            "Test": ["CMD-SHELL", "curl -f localhost"],
            "Interval": 90 * NS,
            "Timeout": NS // 4,
            "Retries": 5,
            "StartPeriod": 3600 * NS,
            "StartInterval": 5 * NS,
        },
    ),
    (
        "    healthcheck:\n      test: [CMD, pg_isready, -U, x]\n",
        "healthcheck",
        {
            "Test": ["CMD", "pg_isready", "-U", "x"],
            "Interval": 30 * NS,
            "Timeout": 30 * NS,
            "Retries": 3,
            "StartPeriod": 0,
            "StartInterval": 5 * NS,
        },
    ),
    (
        "    healthcheck:\n      test: [CMD-SHELL, 'exit 0']\n      interval: 2s\n",
        "healthcheck",
        {
            "Test": ["CMD-SHELL", "exit 0"],
            "Interval": 2 * NS,
            "Timeout": 30 * NS,
            "Retries": 3,
            "StartPeriod": 0,
            "StartInterval": 5 * NS,
        },
    ),
    ("    healthcheck:\n      test: [NONE]\n", "healthcheck", {"Test": ["NONE"]}),
    ("    healthcheck:\n      disable: true\n", "healthcheck", {"Test": ["NONE"]}),
    # working_dir / user as written, numbers as strings
    ("    user: '1000:1000'\n    working_dir: /srv\n", "user", "1000:1000"),
]


@pytest.mark.parametrize("web, field, expected", FORMS)
def test_each_compose_form_reads_as_compose_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, web: str, field: str, expected: object
) -> None:
    monkeypatch.setenv("STACX_T_HOST", "from-host")
    monkeypatch.setenv("STACX_T_EMPTY", "")
    monkeypatch.delenv("STACX_T_UNSET", raising=False)
    assert _load(tmp_path, web)[field] == expected


def test_build_as_a_string_or_a_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ctx" / "docker").mkdir(parents=True)
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (tmp_path / "ctx" / "docker" / "Dockerfile.web").write_text("FROM debian:bookworm\n")
    monkeypatch.setenv("STACX_T_HOST", "from-host")
    plain = ("Dockerfile", {}, None)
    for build, expected in [
        ("build: ./ctx", plain),
        ("build: {context: ctx}", plain),
        (
            "build:\n      context: ctx\n      dockerfile: docker/Dockerfile.web\n"
            "      args: {A: 1, STACX_T_HOST: null}\n      target: runtime",
            ("docker/Dockerfile.web", {"A": "1", "STACX_T_HOST": "from-host"}, "runtime"),
        ),
        (
            "build:\n      context: ctx\n      args: [A=x=y, STACX_T_HOST, STACX_T_UNSET]",
            ("Dockerfile", {"A": "x=y", "STACX_T_HOST": "from-host"}, None),
        ),
    ]:
        (tmp_path / "docker-compose.yaml").write_text(f"services:\n  web:\n    {build}\n")
        web = load_compose(tmp_path / "docker-compose.yaml")[0]["web"]
        assert web.build_dir == str((tmp_path / "ctx").resolve()), build
        assert (web.dockerfile, web.build_args, web.build_target) == expected, build


@pytest.mark.parametrize(
    "build, message",
    [
        (
            "{context: ctx, dockerfile: Dockerfile.nope}",
            "services.web.build.dockerfile = 'Dockerfile.nope': no such file in the build context",
        ),
        (
            "{context: ctx, dockerfile: ../outside}",
            "services.web.build.dockerfile = '../outside': no such file in the build context",
        ),
        ("{context: missing}", "services.web.build.context = 'missing': no such directory"),
    ],
)
def test_a_build_that_names_what_is_not_there_is_refused(
    tmp_path: Path, build: str, message: str
) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "outside").write_text("FROM debian:bookworm\n")
    (tmp_path / "docker-compose.yaml").write_text(f"services:\n  web:\n    build: {build}\n")
    with pytest.raises(TaskError, match=re.escape(message)):
        load_compose(tmp_path / "docker-compose.yaml")


def test_dotenv_beside_the_file_and_the_environment_winning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("# comment\nSTACX_T_A=from-file\nSTACX_T_B='quoted'\n")
    monkeypatch.setenv("STACX_T_A", "from-env")
    monkeypatch.delenv("STACX_T_B", raising=False)
    env = _load(tmp_path, "    environment:\n      - A=$STACX_T_A\n      - B=${STACX_T_B}\n")[
        "environment"
    ]
    assert env == {"A": "from-env", "B": "quoted"}


@pytest.mark.parametrize(
    "web, message",
    [
        (
            "    depends_on: db\n",
            r"services\.web\.depends_on: 'db' is not valid; expected a list or a mapping",
        ),
        (
            "    depends_on:\n      db: {condition: started}\n",
            r"services\.web\.depends_on.*(not valid|is not one of)",
        ),
        (
            "    command: {a: 1}\n",
            r"services\.web\.command: \{'a': 1\} is not valid; expected null or a string or a list",
        ),
        (
            "    environment: 5\n",
            r"services\.web\.environment: 5 is not valid; expected a mapping or a list",
        ),
        ("    healthcheck:\n      retries: [1]\n", r"services\.web\.healthcheck\.retries: \[1\]"),
        (
            "    imagee: x\n",
            r"services\.web: unknown key\(s\) \['imagee'\] \(did you mean \['image'\]\?\); accepted: ",
        ),
        ("    build: {context: ., bogus: 1}\n", r"services\.web\.build"),
    ],
)
def test_a_malformed_file_is_a_task_error_with_the_schemas_message(
    tmp_path: Path, web: str, message: str
) -> None:
    with pytest.raises(TaskError, match=r"docker-compose\.yaml: " + message):
        _load(tmp_path, web)


@pytest.mark.parametrize(
    "web, message",
    [
        (
            "    environment:\n      - A=${STACX_T_UNSET:?must be set}\n",
            "required variable STACX_T_UNSET is missing a value: must be set",
        ),
        ("    environment:\n      - A=${STACX_T_UNSET\n", "unclosed"),
        ("    environment:\n      - A=${1BAD}\n", "invalid interpolation format"),
        ("    depends_on: [nosuch]\n", "no service 'nosuch'"),
        ("    healthcheck:\n      test: [curl, x]\n", "must start with CMD, CMD-SHELL or NONE"),
        ("    healthcheck:\n      test: 'true'\n      interval: 5 seconds\n", "duration"),
    ],
)
def test_what_compose_itself_refuses_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, web: str, message: str
) -> None:
    monkeypatch.delenv("STACX_T_UNSET", raising=False)
    with pytest.raises(TaskError, match=message):
        _load(tmp_path, web)


def test_unset_variables_are_blank_and_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STACX_T_UNSET", raising=False)
    (tmp_path / "docker-compose.yaml").write_text(
        "x-common: &c {A: $STACX_T_UNSET}\nservices:\n  web:\n    image: nginx\n"
        "    environment: *c\n"
    )
    services, notes = load_compose(tmp_path / "docker-compose.yaml")
    assert services["web"].environment == {"A": ""}
    assert (
        "docker-compose.yaml: services.web.environment.A: the STACX_T_UNSET variable is "
        "not set; defaulting to a blank string" in notes
    )


def test_go_durations_and_interpolation_edges() -> None:
    assert duration_ns("1h2m3.5s", 0, "d") == int(3723.5 * NS)
    assert duration_ns("10us", 0, "d") == 10_000 and duration_ns(None, 3, "d") == 3 * NS
    notes: list[str] = []
    assert interpolate("cost $5 and $$ and ${A}", {"A": "x"}, "w", notes) == "cost $5 and $ and x"
    assert notes == []
