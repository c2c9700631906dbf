"""The outbound host policy of tools that connect where a request says (MCP, ``web_fetch``).

A host that is or resolves to a non-public address is refused unless the operator lists it exactly,
so the gateway is no way into its own network. :func:`is_public_address` also serves a resolver
that checks the connection's own DNS answers (they may change between check and use).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable


class HostRefused(Exception):
    """The host may not be contacted; ``unresolvable`` says whether it did not resolve at all."""

    def __init__(self, message: str, *, unresolvable: bool = False) -> None:
        super().__init__(message)
        self.unresolvable = unresolvable


def host_listed(host: str, patterns: Iterable[str]) -> tuple[bool, bool]:
    """(allowed, exact): whether ``host`` matches ``patterns`` (``*``, ``*.suffix`` or a host), and
    whether by an exact entry."""
    host = host.lower().rstrip(".")
    matched = False
    for raw in patterns:
        pattern = raw.strip().lower().rstrip(".")
        if not pattern:
            continue
        if pattern == host or pattern.strip("[]") == host:
            return True, True
        if pattern == "*" or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            matched = True
    return matched, False


def is_public_address(address: str) -> bool:
    """Whether one IP address is a public one (not loopback, private, link-local, reserved …)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (an IP literal is its own answer)."""
    try:
        return [ipaddress.ip_address(host.strip("[]")).compressed]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


async def check_public_host(host: str, port: int, exempt: Iterable[str]) -> None:
    """Raise :class:`HostRefused` unless ``host`` resolves only to public addresses or is listed
    exactly in ``exempt``."""
    if host_listed(host, exempt)[1]:
        return
    try:
        addresses = await resolve(host, port)
    except OSError:
        raise HostRefused(f"host {host!r} could not be resolved", unresolvable=True) from None
    if not addresses or not all(is_public_address(a) for a in addresses):
        raise HostRefused(f"host {host!r} resolves to a loopback, private or link-local address")
