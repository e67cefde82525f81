"""Who may use the service and how much of it: read once from :class:`~crag_dspy.settings.Settings`
and serve's ``--host``/``--insecure``, before anything is loaded or bound."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..flag_policy import OnFlag
from ..settings import LOOPBACK_HOSTS, Settings

__all__ = ["MIN_KEY_CHARS", "ExposureError", "ServePolicy", "is_loopback", "policy_for"]

MIN_KEY_CHARS = 16  # shorter keys could be found by trying; `openssl rand -hex 24` makes a good one
_ANY_INTERFACE = {"", "0.0.0.0", "::", "[::]"}


class ExposureError(ValueError):
    """The service would be reachable beyond this machine without the protection it needs."""


@dataclass(frozen=True)
class ServePolicy:
    """The service's limits. The defaults are the loopback developer's: no key, the full trace on
    request, Host headers of this machine only."""

    api_keys: tuple[str, ...] = ()
    debug_keys: tuple[str, ...] = ()
    open_debug: bool = True
    """Anyone may ask for the full trace (``?debug=1``): only on loopback with no keys configured."""
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    max_body_bytes: int = 65536
    rate_limit: str | None = "60/minute"
    request_timeout_s: float = 300.0
    workers: int = 4
    queue: int = 16
    on_flag: OnFlag = "warn"
    """A flagged answer whose sources disagree or instruct: shown with its warning, or withheld."""

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys or self.debug_keys)


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an address, IPv6 with or without brackets) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_header_name(host: str) -> str:
    """``host`` as Starlette reads it from a Host header: IPv6 literals keep their brackets."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host.lower()


def policy_for(settings: Settings, host: str, *, insecure: bool = False) -> tuple[ServePolicy, list[str]]:
    """The policy for serving on ``host``, and the warnings to print; raises :class:`ExposureError`
    (one line, never holding a key) when ``host`` is not loopback and no key is configured."""
    keys = tuple(k.get_secret_value() for k in settings.api_keys)
    debug_keys = tuple(k.get_secret_value() for k in settings.debug_api_keys)
    if any(len(key) < MIN_KEY_CHARS for key in keys + debug_keys):
        raise ExposureError(
            f"CRAG_API_KEYS / CRAG_DEBUG_API_KEYS: every key must be at least {MIN_KEY_CHARS} characters "
            "(e.g. `openssl rand -hex 24`)"
        )
    if not all(key.isascii() and key.isprintable() for key in keys + debug_keys):
        # HTTP headers reach the app decoded as latin-1: a key sent as UTF-8 could never match one with
        # an accent, so it would be refused on every request while the server looked healthy.
        raise ExposureError(
            "CRAG_API_KEYS / CRAG_DEBUG_API_KEYS: a key holds a character that is not printable ASCII, "
            "which clients cannot send in an HTTP header as it is (e.g. `openssl rand -hex 24`)"
        )
    local = is_loopback(host)
    warnings: list[str] = []
    if not local:
        if not (keys or debug_keys) and not insecure:
            raise ExposureError(
                f"--host {host} is reachable beyond this machine: set CRAG_API_KEYS (clients send "
                "'Authorization: Bearer <key>'), or pass --insecure to serve without keys"
            )
        if not (keys or debug_keys):
            warnings.append(
                f"serving on {host} WITHOUT API keys (--insecure): anyone who reaches the port can use the LM"
            )
        else:
            warnings.append(f"serving on {host}, beyond this machine: every request needs an API key")
    hosts = tuple(settings.allowed_hosts)
    if host not in _ANY_INTERFACE and _host_header_name(host) not in hosts:
        hosts += (_host_header_name(host),)
    if host in _ANY_INTERFACE and set(hosts) <= set(LOOPBACK_HOSTS):
        warnings.append(
            "only requests whose Host header is this machine's name are answered: "
            "list the names clients use in CRAG_ALLOWED_HOSTS"
        )
    rate = settings.rate_limit.strip()
    policy = ServePolicy(
        api_keys=keys,
        debug_keys=debug_keys,
        open_debug=local and not (keys or debug_keys),
        allowed_hosts=hosts,
        max_body_bytes=settings.max_body_bytes,
        rate_limit=None if rate.lower() in ("", "none") else rate,
        request_timeout_s=settings.request_timeout_s,
        workers=settings.serve_workers,
        queue=settings.serve_queue,
        on_flag=settings.on_flag,
    )
    return policy, warnings
