"""Where a server listens: the socket bound before any work, and the URL a client uses for it."""

from __future__ import annotations

import socket


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound before any work (a port in use is an error at once); port 0 takes a free one. `host`: a name,
    an IPv4 or IPv6 address (`::1`, `[::1]`, `fe80::1%eth0`)."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be 0-65535 (0: a free port), got {port}")
    bare = host.removeprefix("[").removesuffix("]")
    try:
        family, _, _, _, address = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def server_url(host: str, port: int) -> str:
    """The URL a client uses for `host`: an IPv6 address in brackets, its zone's `%` escaped (RFC 6874)."""
    bare = host.removeprefix("[").removesuffix("]")
    return f"http://[{bare.replace('%', '%25')}]:{port}" if ":" in bare else f"http://{bare}:{port}"
