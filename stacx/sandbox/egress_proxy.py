"""The filtering forward proxy of `network_mode = "allowlist"` (see stacx.sandbox.egress).

Standard library only: it runs as `python3 -c <this file> <allowed hosts as JSON>` in a
sidecar from the base image, reachable by the sandbox on its internal network. It serves
HTTP CONNECT (https, any TLS or TCP protocol a client tunnels) and plain-HTTP requests in
absolute form, and answers 403 for any host `host_allowed` refuses. The proxy resolves names
itself, so the sandbox needs no DNS for the outside (and gets none).

SSRF: a name that is allowed but resolves to loopback, link-local (169.254.169.254, the cloud
metadata address) or a private address is refused (403) unless the entry is that private IP
itself (`address_allowed`); the proxy connects to the address it vetted.

Limits: only clients that honour HTTP(S)_PROXY get out; nothing else is forwarded (no UDP,
no raw TCP without CONNECT). Hosts are matched by the name the client asks for.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
import sys
from collections.abc import Sequence

PORT = 3128


def host_allowed(host: str, port: int, allowed: Sequence[str]) -> bool:
    """`host:port` matches an entry "name" (any port), "name:port", or "*.name" (any
    subdomain of name, not name itself); names compare case-insensitively."""
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
        if name.startswith("*."):
            if host.endswith(name[1:]):
                return True
        elif host == name:
            return True
    return False


def address_allowed(address: str, host: str, allowed: Sequence[str]) -> bool:
    """Whether the proxy may connect to `address` (what `host` resolved to): a public address,
    or a private one (RFC 1918, ULA) that an allowed_hosts entry names as a literal IP. Never
    loopback, link-local (169.254.169.254, cloud metadata), unspecified or multicast: an
    allowed name that resolves there (a DNS answer, `localhost`) is refused (SSRF)."""
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
    """The first address of `host` the proxy may connect to (None: it resolves only to
    forbidden ones). Connecting to the vetted address, not the name, leaves no second lookup
    for a rebinding DNS answer to change."""
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
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


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
        kept = [
            ln
            for ln in lines[1:]
            if ln
            and not ln.lower().startswith(
                ("proxy-connection:", "proxy-authorization:", "connection:")
            )
        ]
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
