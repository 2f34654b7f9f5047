"""The offline base images (stacx/base:bookworm, trixie, noble): debootstrap + `docker import`, with
the host's CA trust, each built on demand the first time a task needs it (`ensure_base`).
Idempotent; a failed build leaves no half-tagged image. Needs root, debootstrap and docker.

Design: docs/tasks.md#base-images-offline, docs/sandboxes.md#task-images
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from stacx.errors import BaseUnavailableError, SandboxError

BASE_IMAGE = "stacx/base:bookworm"
TRIXIE_IMAGE = "stacx/base:trixie"
NOBLE_IMAGE = "stacx/base:noble"
SUITE = "bookworm"
SUITES = ("bookworm", "trixie", "noble")
PYTHON_MINOR = {BASE_IMAGE: "3.11", TRIXIE_IMAGE: "3.13", NOBLE_IMAGE: "3.12"}  # python3 in each
DISTRO = {"bookworm": "Debian", "trixie": "Debian", "noble": "Ubuntu"}
UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
# noble's ubuntu-keyring (its Packages entry); used when the host has no Ubuntu keyring
UBUNTU_KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
UBUNTU_KEYRING_SHA256 = "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8"
HOST_UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
PACKAGES = (
    "bash",
    "coreutils",
    "python3",
    "python-is-python3",
    "python3-pytest",
    "python3-pip",
    "python3-venv",
    "procps",
    "ca-certificates",
)
# trixie stands in for python:3.12+ images, which ship no pytest: none here either (a task
# that needs it installs it, as it must under Harbor). bookworm's list is kept as it was.
# noble is what ubuntu:24.04 plus the Python an Ubuntu task installs gives: no pytest either.
SUITE_PACKAGES = {
    "bookworm": PACKAGES,
    "trixie": tuple(p for p in PACKAGES if p != "python3-pytest"),
    "noble": ("python3", "python3-pip", "python3-venv", "ca-certificates"),
}
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def host_mirrors(paths: tuple[Path, ...] = APT_SOURCES) -> tuple[str | None, str | None]:
    """(Debian archive URI, security URI) of the host's apt sources; None if absent."""
    uris: list[str] = []
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.list")) + sorted(p.glob("*.sources")) if p.is_dir() else [p]
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["deb"]:
                uris += [w for w in words[1:] if "://" in w][:1]
            elif words[:1] == ["URIs:"]:
                uris += words[1:]
    security = next((u for u in uris if "security" in u), None)
    debian = next((u for u in uris if "security" not in u and "debian" in u), None)
    return debian, security


HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_EXTRA_CERTS = Path("/usr/local/share/ca-certificates")

# What `docker import` cannot take from the root filesystem: the image config.
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONUNBUFFERED=1",
    # Debian's python is "externally managed" (PEP 668); task Dockerfiles written for
    # python:3.x-slim or ubuntu run a plain `pip install`, which must work here too.
    "ENV PIP_BREAK_SYSTEM_PACKAGES=1",
    "ENV PIP_ROOT_USER_ACTION=ignore",
    "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
    "ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
    "WORKDIR /app",
    'CMD ["bash"]',
)

Log = Callable[[str], None]
_PEM = re.compile(r"^-----BEGIN CERTIFICATE-----$.*?^-----END CERTIFICATE-----$", re.M | re.S)


def image_exists(tag: str) -> bool:
    """Whether the local engine has this tag; SandboxError with no `docker` or engine."""
    if shutil.which("docker") is None:
        raise SandboxError("the `docker` command is not installed (docker.io provides it)")
    proc = subprocess.run(
        ["docker", "image", "inspect", tag], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 and "no such image" not in proc.stderr.lower():
        raise SandboxError(f"the Docker engine does not answer: {proc.stderr.strip()[:500]}")
    return proc.returncode == 0


def split_pem_bundle(text: str) -> list[str]:
    """The PEM certificates of a bundle, each normalized to its BEGIN..END block."""
    plain = "\n".join(line.strip() for line in text.splitlines())
    return [cert + "\n" for cert in _PEM.findall(plain)]


def extra_certificates(host_bundle: str, stock_bundle: str) -> list[str]:
    """Certificates of the host bundle that the stock bundle lacks (order kept)."""
    stock = set(split_pem_bundle(stock_bundle))
    return [cert for cert in split_pem_bundle(host_bundle) if cert not in stock]


def install_host_trust(root: Path) -> int:
    """Copy the host's CA trust into the root filesystem; returns the number of extra certs."""
    dest = root / "usr/local/share/ca-certificates"
    dest.mkdir(parents=True, exist_ok=True)
    image_bundle = root / "etc/ssl/certs/ca-certificates.crt"
    host_extras = sorted(HOST_EXTRA_CERTS.glob("**/*.crt")) if HOST_EXTRA_CERTS.is_dir() else []
    n_extra = len(host_extras)
    for cert in host_extras:
        target = dest / cert.relative_to(HOST_EXTRA_CERTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cert, target)
    if not host_extras and HOST_BUNDLE.is_file() and image_bundle.is_file():
        extras = extra_certificates(HOST_BUNDLE.read_text(), image_bundle.read_text())
        for i, pem in enumerate(extras):
            (dest / f"stacx-host-{i:03d}.crt").write_text(pem)
        n_extra = len(extras)
    if HOST_BUNDLE.is_file():
        image_bundle.parent.mkdir(parents=True, exist_ok=True)
        # The stock bundle is a symlink target in some layouts; replace, never write through.
        image_bundle.unlink(missing_ok=True)
        shutil.copyfile(HOST_BUNDLE, image_bundle)
    return n_extra


def _run(cmd: list[str], log: Log, **kwargs: object) -> None:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SandboxError(f"base image build: `{' '.join(cmd[:3])} ...` failed:\n{tail}")


def _configure_root(root: Path, mirror: str, suite: str, security: str | None) -> None:
    (root / "app").mkdir(exist_ok=True)
    parts = "main universe" if DISTRO[suite] == "Ubuntu" else "main"
    if DISTRO[suite] == "Ubuntu":
        security = security or mirror  # Ubuntu's archive serves <suite>-security itself
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {suite} {parts}\n"
        f"deb {mirror} {suite}-updates {parts}\n"
        + (f"deb {security} {suite}-security {parts}\n" if security else "")
    )
    # trixie's and noble's debootstrap write deb822 sources too; one list is enough
    for deb822 in ("debian.sources", "ubuntu.sources"):
        (root / "etc/apt/sources.list.d" / deb822).unlink(missing_ok=True)
    # The container has no init and no policy for services; keep apt from starting any.
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / cache).glob("*"):
            if entry.is_file():
                entry.unlink()


def _docker_import(root: Path, tag: str, suite: str, log: Log) -> None:
    """`tar -C root -c . | docker import` as `tag`, with the image's config (IMAGE_CHANGES)."""
    changes = (*IMAGE_CHANGES, f"LABEL stacx.base={suite}")
    cmd = ["docker", "import", *(a for change in changes for a in ("--change", change)), "-", tag]
    log("$ tar -C root -c . | " + " ".join(cmd[:2]) + f" ... - {tag}")
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(root), "-c", "."],
        stdout=subprocess.PIPE,
    )
    imp = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True, check=False)
    assert tar.stdout is not None
    tar.stdout.close()
    tar_rc = tar.wait()
    if tar_rc != 0 or imp.returncode != 0:
        raise SandboxError(f"docker import of {tag} failed: {imp.stderr[-2000:]}")


def bootstrap_base_image(
    *,
    tag: str | None = None,
    force: bool = False,
    mirror: str | None = None,
    suite: str = SUITE,
    log: Log = lambda _msg: None,
) -> bool:
    """Build `tag` from scratch; False if it existed (unless `force`); SandboxError by step."""
    if suite not in SUITES:
        raise SandboxError(f"suite {suite!r}: accepted: {', '.join(SUITES)}")
    tag = tag or f"stacx/base:{suite}"
    if not force and image_exists(tag):
        log(f"{tag} exists; nothing to do (use --force to rebuild)")
        return False
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "`debootstrap` is not installed: `apt-get install debootstrap` (tools/setup.sh does)"
        )
    if os.geteuid() != 0:
        raise SandboxError("building the base image needs root (debootstrap chroots)")
    host, security = host_mirrors()
    if DISTRO[suite] == "Ubuntu":
        mirror, security = mirror or os.environ.get("STACX_UBUNTU_MIRROR") or UBUNTU_ARCHIVE, None
    mirror = mirror or os.environ.get("STACX_DEBIAN_MIRROR") or host
    if not mirror:
        raise SandboxError(
            "no Debian mirror: the host's apt sources name none; pass --mirror URL "
            "(or set $STACX_DEBIAN_MIRROR)"
        )
    with tempfile.TemporaryDirectory(prefix="stacx-base-") as tmp:
        root = Path(tmp) / "root"
        _run(_debootstrap_command(suite, root, mirror, Path(tmp), log), log)
        n_extra = install_host_trust(root)
        log(f"copied host CA bundle and {n_extra} extra certificate(s)")
        _configure_root(root, mirror, suite, security)
        _docker_import(root, tag, suite, log)
    log(f"built {tag}")
    return True


def _debootstrap_command(suite: str, root: Path, mirror: str, tmp: Path, log: Log) -> list[str]:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(SUITE_PACKAGES[suite])}"]
    if DISTRO[suite] == "Debian":
        return [*cmd, suite, str(root), mirror]
    cmd += ["--components=main,universe", f"--keyring={ubuntu_keyring(mirror, tmp, log)}"]
    # debootstrap older than noble has no script of that name; every Ubuntu suite since
    # gutsy is the same script (debootstrap's own noble is a link to it)
    script = Path("/usr/share/debootstrap/scripts") / suite
    return [
        *cmd,
        suite,
        str(root),
        mirror,
        str(script if script.exists() else script.parent / "gutsy"),
    ]


def ubuntu_keyring(mirror: str, tmp: Path, log: Log) -> Path:
    """The Ubuntu archive keyring: the host's, else the pinned ubuntu-keyring package's."""
    if HOST_UBUNTU_KEYRING.is_file():
        return HOST_UBUNTU_KEYRING
    deb = tmp / "ubuntu-keyring.deb"
    url = f"{mirror.rstrip('/')}/{UBUNTU_KEYRING_DEB}"
    log(f"$ curl {url}")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            deb.write_bytes(resp.read())
    except OSError as exc:
        raise SandboxError(f"Ubuntu's archive does not answer ({url}): {exc}") from exc
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    if digest != UBUNTU_KEYRING_SHA256:
        raise SandboxError(f"{url}: SHA-256 {digest}, expected {UBUNTU_KEYRING_SHA256}")
    _run(["dpkg-deb", "-x", str(deb), str(tmp / "keyring")], log)
    return tmp / "keyring" / HOST_UBUNTU_KEYRING.relative_to("/")


def archive_answers(suite: str, timeout: float = 10.0) -> str | None:
    """None when the archive `suite` is built from answers; else why not (for a test's skip)."""
    mirror = (
        os.environ.get("STACX_UBUNTU_MIRROR") or UBUNTU_ARCHIVE
        if DISTRO[suite] == "Ubuntu"
        else os.environ.get("STACX_DEBIAN_MIRROR") or host_mirrors()[0]
    )
    if not mirror:
        return "the host's apt sources name no Debian mirror"
    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except OSError as exc:
        return f"{DISTRO[suite]}'s archive does not answer ({url}: {exc})"


_building = threading.Lock()


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_base(tag: str, log: Log = _stderr) -> None:
    """Build the STACX base `tag` unless the engine has it; BaseUnavailableError when it cannot."""
    suite = tag.removeprefix("stacx/base:")
    if not tag.startswith("stacx/base:") or suite not in SUITES:
        return
    with _building:
        if image_exists(tag):
            return
        log(
            f"building base image {tag} ({DISTRO[suite]} {suite}, Python {PYTHON_MINOR[tag]}) "
            "on first use; later tasks reuse it"
        )
        start = time.monotonic()
        try:
            bootstrap_base_image(tag=tag, suite=suite)
        except SandboxError as exc:
            raise BaseUnavailableError(f"base image {tag} cannot be built: {exc}") from exc
        log(f"built base image {tag} in {time.monotonic() - start:.0f} s")


def base_table() -> list[dict[str, str]]:
    """One row per STACX base: tag, distribution, Python, whether built, its size."""
    rows = []
    for suite in SUITES:
        tag = f"stacx/base:{suite}"
        proc = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}} {{.Created}}", tag],
            capture_output=True,
            text=True,
            check=False,
        )
        size, _, created = proc.stdout.strip().partition(" ")
        rows.append(
            {
                "base": tag,
                "distribution": f"{DISTRO[suite]} {suite}",
                "python": PYTHON_MINOR[tag],
                "built": created[:19] if proc.returncode == 0 else "no (built on first use)",
                "size": f"{int(size) / 1e6:.0f} MB" if proc.returncode == 0 else "",
            }
        )
    return rows
