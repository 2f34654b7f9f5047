"""The filtering forward proxy of `network_mode = "allowlist"`, standard library only (run as
`python3 -c <this file> <allowed hosts as JSON>`): HTTP CONNECT and absolute-form HTTP, 403 for any
other host, names resolved and vetted by the proxy (no SSRF to loopback, link-local or unlisted
private addresses). Only clients that honour HTTP(S)_PROXY get out.

Design: docs/sandboxes.md#hardening
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import socket
import sys
from collections.abc import Sequence

PORT = 3128
_HOP_BY_HOP = ("proxy-connection:", "proxy-authorization:", "connection:")  # not forwarded


def host_allowed(host: str, port: int, allowed: Sequence[str]) -> bool:
    """`host:port` matches "name" (any port), "name:port" or "*.name" (subdomains only)."""
    host = host.strip().lower().rstrip(".")
    for entry in allowed:
        entry = entry.strip().lower()
        name, want = entry, None
        if entry.startswith("[") or entry.count(":") == 1:  # [v6]:port or name:port
            head, _, tail = entry.rpartition(":")
            if tail.isdigit() and (not head.startswith("[") or head.endswith("]")):
                name, want = head, int(tail)
        name = name.strip("[]")
        if want is not None and want != port:
            continue
        if host.endswith(name[1:]) if name.startswith("*.") else host == name:
            return True
    return False


def address_allowed(address: str, host: str, allowed: Sequence[str]) -> bool:
    """A public address, or a private one an entry names as an IP; never loopback or link-local."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return False
    if ip.is_global:
        return True
    literal = host.strip("[]").lower()
    return literal == str(ip) and host_allowed(
        host, 0, [e.rsplit(":", 1)[0] if e.count(":") == 1 else e for e in allowed]
    )


async def _vetted_address(host: str, port: int, allowed: Sequence[str]) -> str | None:
    """The first address of `host` the proxy may connect to (no second lookup to rebind) or None."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        if address_allowed(str(sockaddr[0]), host, allowed):
            return str(sockaddr[0])
    return None


def _split(target: str, default_port: int) -> tuple[str, int]:
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    host, _, port = target.partition(":")
    return host, int(port) if port else default_port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        with contextlib.suppress(OSError):  # a reset connection ends the pipe
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _refuse(writer: asyncio.StreamWriter, code: int, why: str) -> None:
    body = f"stacx egress proxy: {why}\n".encode()
    writer.write(
        f"HTTP/1.1 {code} {why}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    writer.close()


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, allowed: Sequence[str]
) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        await _refuse(writer, 400, "Bad Request")
        return
    path = "/"
    if method == "CONNECT":
        host, port = _split(target, 443)
    else:
        match = re.match(r"^http://([^/]+)(/.*)?$", target)
        if match is None:
            await _refuse(writer, 400, "Bad Request")
            return
        host, port = _split(match.group(1), 80)
        path = match.group(2) or "/"
    if not host_allowed(host, port, allowed):
        await _refuse(writer, 403, f"Forbidden (host {host}:{port} is not in allowed_hosts)")
        return
    try:
        address = await _vetted_address(host, port, allowed)
    except OSError as exc:
        await _refuse(writer, 502, f"Bad Gateway ({exc})")
        return
    if address is None:
        await _refuse(
            writer,
            403,
            f"Forbidden (host {host} resolves to a loopback, link-local or private address)",
        )
        return
    try:
        up_reader, up_writer = await asyncio.open_connection(address, port)
    except OSError as exc:
        await _refuse(writer, 502, f"Bad Gateway ({exc})")
        return
    if method == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
    else:  # origin form to the server, one request per connection
        kept = [ln for ln in lines[1:] if ln and not ln.lower().startswith(_HOP_BY_HOP)]
        request = [f"{method} {path} {version}", *kept, "Connection: close"]
        up_writer.write(("\r\n".join(request) + "\r\n\r\n").encode("latin-1"))
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def main(allowed: Sequence[str]) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, allowed), host="0.0.0.0", port=PORT
    )
    print(f"stacx egress proxy on :{PORT}, allowed: {list(allowed)}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
