"""Refuse job targets on the metadata service or link-local addresses (SSRF guard).

A job document comes from object storage; if it could point the carrier at 100.100.100.200 it could read
the instance role's STS credentials and send them anywhere. Names are resolved before the job runs and
every resolved address must pass; the ttft job's connector re-checks at connect time (DNS rebinding).
Loopback is allowed on purpose: localcloud targets live on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

BLOCKED_NETS = tuple(ipaddress.ip_network(n) for n in (
    "169.254.0.0/16",      # link-local, AWS/GCP metadata
    "100.100.100.200/32",  # Aliyun ECS metadata service
    "fe80::/10",           # IPv6 link-local
    "fd00:ec2::254/128",   # AWS IMDS over IPv6
    "0.0.0.0/32",          # "this host": connects to local services on Linux
    "::/128",
))


class TargetRefused(ValueError):
    pass


def blocked_address(addr: str) -> str | None:
    """Why `addr` (an IP literal) must not be contacted, or None if it may."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is the same socket as 169.254.169.254
    for net in BLOCKED_NETS:
        if ip in net:
            return f"{ip} is in {net} (metadata / link-local)"
    return None


def split_target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"target {url!r}: only http and https are allowed")
    if not parts.hostname:
        raise TargetRefused(f"target {url!r} has no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def check_target(url: str, timeout_s: float = 5.0) -> list[str]:
    """Resolve the target's host and refuse it if any address is blocked; returns the addresses."""
    host, port = split_target(url)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addrs = [str(literal)]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise TargetRefused(f"target host {host!r} does not resolve: {exc or 'timeout'}") from None
        addrs = sorted({str(info[4][0]) for info in infos})
    for addr in addrs:
        why = blocked_address(addr)
        if why:
            raise TargetRefused(f"target {url!r} refused: {host} → {why}")
    return addrs
