"""Authenticated multi-host messaging on loopback: a real nats-server with TLS (certificates
made here) and the per-role users of stacx.bus.auth. A rollout worker publishes its run's
events and requests sandboxes; it cannot read another run's subjects or stream, nor send
admin requests; a wrong or missing credential, or an unknown CA, is refused with a clear
error naming the URL (never its password)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
import pytest

from stacx.bus import auth
from stacx.bus.client import ensure_stream
from stacx.bus.connection import ENV_CA, NatsAuthError, NatsUnreachable, connect
from stacx.bus.server import EmbeddedNats
from stacx.sandbox import remote_wire
from tests.sandbox.conftest import base_image

__all__ = ["base_image"]  # the session fixture of the sandbox tests

PW = {"w1": "pw-w1", "w2": "pw-w2", "svc": "pw-svc", "adm": "pw-adm"}


def _certs(d: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key), as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)

    def build(
        subject: str,
        issuer: str,
        key: ec.EllipticCurvePrivateKey,
        signer: ec.EllipticCurvePrivateKey,
        ca: bool,
    ) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = build("stacx test CA", "stacx test CA", ca_key, ca_key, True)
    cert = build("127.0.0.1", "stacx test CA", key, ca_key, False)
    paths = d / "ca.pem", d / "server.pem", d / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture
def secure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EmbeddedNats, Path]]:
    ca, cert, key = _certs(tmp_path)
    users = [
        auth.worker("w1", PW["w1"], "r1"),
        auth.worker("w2", PW["w2"], "r2"),
        auth.service("svc", PW["svc"], "host1"),
        auth.admin("adm", PW["adm"]),
    ]
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'tls {{ cert_file: "{cert}", key_file: "{key}", timeout: 5 }}\n'
        + auth.authorization_block(users)
        + "\n"
    )
    monkeypatch.setenv(ENV_CA, str(ca))
    with EmbeddedNats(tmp_path / "store", config=conf) as server:
        yield server, ca


def _url(server: EmbeddedNats, user: str, password: str | None = None) -> str:
    return f"tls://{user}:{password or PW[user]}@127.0.0.1:{server.port}"


def test_subjects_are_those_of_the_wire_and_the_events() -> None:
    from stacx.events import stream_name, subject

    w = auth.worker("u", "p", "run-1")["permissions"]
    allow = w["publish"]["allow"]  # type: ignore[index]
    assert remote_wire.run_subject("any", "run-1").replace(".any.", ".*.") in allow
    assert (
        remote_wire.DISCOVER in allow and f"$JS.API.STREAM.CREATE.{stream_name('run-1')}" in allow
    )
    assert subject("run-1", "x").startswith(allow[0][:-1])
    assert remote_wire.ADVERT in w["subscribe"]["allow"]  # type: ignore[index]
    assert (
        remote_wire.admin_subject("h").replace(".h.", ".*.")
        in auth.admin("a", "p")["permissions"]["publish"]["allow"]  # type: ignore[index]
    )


async def test_worker_uses_its_run_and_cannot_read_anothers(
    secure: tuple[EmbeddedNats, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = secure
    w1, w2 = await connect(_url(server, "w1")), await connect(_url(server, "w2"))
    try:
        js1 = w1.jetstream(timeout=3)
        await ensure_stream(js1, "r1")
        ack = await js1.publish("stacx.r1.Probe", b"mine")
        assert ack.stream == "STACX_r1"
        got: list[bytes] = []

        async def took(msg: nats.aio.msg.Msg) -> None:
            got.append(msg.data)

        with caplog.at_level(logging.WARNING):
            await w1.subscribe("stacx.r2.>", cb=took)
            await w1.flush()
            await ensure_stream(w2.jetstream(timeout=3), "r2")
            await w2.jetstream().publish("stacx.r2.Secret", b"theirs")
            with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
                await js1.stream_info("STACX_r2")  # the request is dropped by the server
            await w1.flush()
        assert got == []
        assert 'permissions violation for subscription to "stacx.r2.>"' in caplog.text
        assert "subject permissions" in caplog.text
    finally:
        await w1.close()
        await w2.close()


async def test_worker_requests_sandboxes_but_cannot_stop_another_hosts(
    secure: tuple[EmbeddedNats, Path],
) -> None:
    server, _ = secure
    svc, w1 = await connect(_url(server, "svc")), await connect(_url(server, "w1"))
    try:
        seen: list[str] = []

        async def answer(msg: nats.aio.msg.Msg) -> None:
            seen.append(msg.subject)
            await msg.respond(b"ok")

        await svc.subscribe("stacx.sandbox.svc.host1.>", cb=answer)
        await svc.flush()
        reply = await w1.request(remote_wire.run_subject("host1", "r1"), b"start", timeout=5)
        assert reply.data == b"ok"
        for subject in (remote_wire.admin_subject("host1"), remote_wire.run_subject("host1", "r2")):
            with pytest.raises(nats.errors.TimeoutError):
                await w1.request(subject, b"stop", timeout=1)
        assert seen == [remote_wire.run_subject("host1", "r1")]
    finally:
        await svc.close()
        await w1.close()


@pytest.mark.parametrize("password", ["wrong", ""], ids=["wrong", "missing"])
async def test_a_wrong_or_missing_credential_is_refused(
    secure: tuple[EmbeddedNats, Path], password: str
) -> None:
    server, _ = secure
    url = _url(server, "w1", password) if password else f"tls://127.0.0.1:{server.port}"
    with pytest.raises(NatsAuthError) as err:
        await asyncio.wait_for(connect(url), 60)
    assert "refused the credentials" in str(err.value) and f"127.0.0.1:{server.port}" in str(
        err.value
    )
    assert "wrong" not in str(err.value)


async def test_an_unknown_ca_is_a_tls_error_naming_the_variable(
    secure: tuple[EmbeddedNats, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _ = secure
    monkeypatch.delenv(ENV_CA)
    with pytest.raises(NatsUnreachable) as err:
        await asyncio.wait_for(connect(_url(server, "w1")), 60)
    assert "TLS" in str(err.value) and ENV_CA in str(err.value), err.value


def test_cli_refused_credentials_are_one_line(secure: tuple[EmbeddedNats, Path]) -> None:
    server, ca = secure
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        ENV_CA: str(ca),
        "STACX_NATS_URL": f"tls://127.0.0.1:{server.port}",
        "STACX_NATS_USER": "adm",
        "STACX_NATS_PASSWORD": "nope",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "stacx", "sandbox", "hosts"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2 and "refused the credentials" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    env["STACX_NATS_PASSWORD"] = PW["adm"]
    ok = subprocess.run(
        [sys.executable, "-m", "stacx", "sandbox", "hosts", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("service,"), ok.stderr


@pytest.mark.docker
async def test_sandbox_service_and_a_remote_run_over_tls_and_roles(
    secure: tuple[EmbeddedNats, Path], base_image: str, tmp_path: Path
) -> None:
    from stacx.ports import Limits
    from stacx.sandbox.remote import RemoteEnvironments
    from stacx.sandbox.remote_wire import run_token
    from tests.sandbox.backends import limits_task, serving

    server, _ = secure
    task = limits_task(tmp_path, base_image, Limits(memory_mb=256, allow_internet=False))
    async with (
        serving(_url(server, "svc"), tmp_path / "svc", "host1"),
        RemoteEnvironments(url=_url(server, "w1"), run_id="r1", token=run_token("r1")) as envs,
        envs.sandbox(envs.task(str(task)), episode_id="e1") as sb,
    ):
        assert (await sb.exec("echo over tls", timeout=30)).stdout == "over tls\n"
