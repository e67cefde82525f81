"""The programs one server serves, by domain name: ``/ask`` chooses one with its ``domain`` field.

Each program runs on its own domain and so on its own store collections; the keys, the rate limit, the
queue and the deadline in front of them are the server's, shared by all (:func:`~crag_dspy.serve.api.create_app`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .service import ProgramService

__all__ = ["Domains", "UnknownDomain"]


class UnknownDomain(ValueError):
    """A request named a domain this server does not serve; the message names the ones it does."""

    def __init__(self, name: str, known: Sequence[str]):
        super().__init__(f"no domain {name!r} is served here; choose one of: {', '.join(known)}")
        self.name = name
        self.known = list(known)


class Domains:
    """Name -> :class:`ProgramService`, in the order given; the first is the default (no ``domain``)."""

    def __init__(self, services: Sequence[ProgramService]):
        if not services:
            raise ValueError("a server needs at least one program to serve")
        by_name: dict[str, ProgramService] = {}
        for service in services:
            name = service.loaded.domain
            if name in by_name:
                # Two programs on one domain could not be told apart by the request's domain field.
                raise ValueError(
                    f"two programs are for domain {name!r} ({_origin(by_name[name])} and {_origin(service)}): "
                    "serve one program per domain"
                )
            by_name[name] = service
        self._by_name = by_name

    @classmethod
    def of(cls, served: ProgramService | Sequence[ProgramService] | Domains) -> Domains:
        """``served`` as a :class:`Domains`: one service, several, or already a :class:`Domains`."""
        if isinstance(served, Domains):
            return served
        if isinstance(served, ProgramService):
            return cls([served])
        return cls(list(served))

    @property
    def names(self) -> list[str]:
        """The domains served, the default first."""
        return list(self._by_name)

    @property
    def default(self) -> ProgramService:
        return next(iter(self._by_name.values()))

    def choose(self, name: str | None) -> ProgramService:
        """The service of domain ``name``, the default for None; :class:`UnknownDomain` otherwise."""
        if name is None:
            return self.default
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownDomain(name, self.names) from None

    def __len__(self) -> int:
        return len(self._by_name)


def _origin(service: ProgramService) -> str:
    path = service.loaded.path
    return path.name if path is not None else "the uncompiled default program"
