"""Host names as the servers check them: the host of a ``Host`` header, and whether a name is
this machine's loopback literally (no DNS). Shared by the store server, the gateway's control
routes and the dashboard, so the three apply one rule against DNS rebinding and cross-site
requests."""

from __future__ import annotations

import ipaddress

__all__ = ["host_name", "is_loopback_name"]


def host_name(value: str | bytes) -> str:
    """The host of a ``Host`` header: ``[::1]:4747`` -> ``::1``, ``localhost:80`` -> ``localhost``."""
    host = (value.decode("latin-1") if isinstance(value, bytes) else value).strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.partition(":")[0]


def is_loopback_name(host: str) -> bool:
    """True when ``host`` names this machine literally (``localhost``, ``127.0.0.0/8``, ``::1``),
    without resolving it (a name that resolves to a loopback address is no proof of intent)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
