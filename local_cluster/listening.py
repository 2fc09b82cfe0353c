"""Which addresses a local TCP port listens on, read from the kernel (Linux `/proc/net/tcp*`),
so a server we start can say where it is really reachable instead of what it was asked for."""
from __future__ import annotations

import ipaddress
import os
import socket

WILDCARDS = frozenset({"0.0.0.0", "::"})


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # The kernel writes each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


def listening_addresses(port: int) -> set[str]:
    """The addresses on which `port` is in LISTEN state here ("0.0.0.0" or "::" for every
    interface); empty where /proc/net is not there to read (not Linux)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                local, state = fields[1], fields[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(_address(address))
    return found


def describe(port: int) -> str:
    """Where `port` listens, for a start-up line: "every interface (*:PORT)" or the
    addresses."""
    addresses = listening_addresses(port)
    if not addresses:
        return f"port {port}"
    if addresses & WILDCARDS:
        return f"every interface (*:{port})"
    return ", ".join(f"{a}:{port}" if ":" not in a else f"[{a}]:{port}"
                     for a in sorted(addresses))


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now, for servers we start."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
