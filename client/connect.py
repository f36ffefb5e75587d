"""Forgiving server addresses and a hint when the protocol and the port disagree.

tritonclient takes ``host:port`` without a scheme; users paste what ``specbuild serve`` prints or what
a browser shows (``http://127.0.0.1:8000``, ``grpc://host:8001/``). :func:`host_port` turns either
into ``host:port``. Triton serves HTTP/1.1 on one port (8000) and gRPC (HTTP/2) on another (8001);
a gRPC call to the HTTP port fails with only "Socket closed". :func:`protocol_hint` asks the port in
the other protocol (one raw request each, no library) and says which flag or port to use.
"""

from __future__ import annotations

import re
import socket

_SCHEME = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*)://")
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
# The HTTP/2 connection preface (RFC 9113 section 3.4) followed by an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def host_port(url: str) -> str:
    """``host:port`` from ``url``: an ``http://`` or ``grpc://`` scheme, a trailing ``/`` and a path are dropped.

    Examples: ``"http://127.0.0.1:8000/"`` -> ``"127.0.0.1:8000"``; ``"grpc://gpu:8001"`` -> ``"gpu:8001"``.
    Raises ``ValueError`` for ``https://`` / ``grpcs://`` (TLS: not supported by specbuild's client), any
    other scheme, an empty address, and a port that is not a number from 1 to 65535 (``:99999``, ``:-1``).
    """
    given, url = url, url.strip()
    match = _SCHEME.match(url)
    if match:
        scheme = match["scheme"].lower()
        if scheme in ("https", "grpcs"):
            raise ValueError(f"{url!r}: TLS ({scheme}://) is not supported by specbuild's Triton client; "
                             "give the plain host:port (put TLS in a proxy in front of the server)")
        if scheme not in ("http", "grpc"):
            raise ValueError(f"url must be host:port (or http://host:port), got {url!r}")
        url = url[match.end():]
    address = url.split("/", 1)[0]
    if not address:
        raise ValueError(f"url {given!r} names no server; give host:port, e.g. 127.0.0.1:8001")
    host, sep, port = address.rpartition(":")
    if sep and "]" not in port:  # host:port ([v6]:port); a bare host or [v6] keeps the library's default port
        if not host:
            raise ValueError(f"url {given!r} names no host; give host:port, e.g. 127.0.0.1:{port or 8001}")
        if not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"url {given!r}: port {port!r} is not a port number (1-65535)")
    return address


def protocol_hint(url: str, protocol: str, timeout_s: float = 1.0) -> str:
    """``"; ..."`` saying to switch protocol or port when ``url`` answers the other protocol, else ``""``.

    Example: ``protocol_hint("127.0.0.1:8000", "grpc")`` on a tritonserver ->
    ``"; 127.0.0.1:8000 answers HTTP, not gRPC: use --protocol http, or the gRPC port (tritonserver's default 8001)"``.
    """
    other = "http" if protocol == "grpc" else "grpc"
    answers = _answers_http if other == "http" else _answers_grpc
    if not answers(url, timeout_s):
        return ""
    names = {"http": "HTTP", "grpc": "gRPC"}
    return (f"; {url} answers {names[other]}, not {names[protocol]}: use --protocol {other}, or the {names[protocol]} "
            f"port (tritonserver's default {DEFAULT_PORTS[protocol]})")


def _exchange(url: str, payload: bytes, timeout_s: float) -> bytes:
    """The first bytes ``url`` sends back after ``payload``; ``b""`` when it cannot be reached."""
    host, _, port = url.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.sendall(payload)
            return sock.recv(64)
    except (OSError, ValueError):
        return b""


def _answers_http(url: str, timeout_s: float) -> bool:
    return _exchange(url, b"GET /v2/health/live HTTP/1.0\r\n\r\n", timeout_s).startswith(b"HTTP/")


def _answers_grpc(url: str, timeout_s: float) -> bool:
    reply = _exchange(url, _H2_PREFACE, timeout_s)
    return len(reply) >= 9 and reply[3] == 0x04  # the server's SETTINGS frame: an HTTP/2 (gRPC) server
