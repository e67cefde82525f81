"""The package version, in a module of its own: modules that record it import it without importing the
package root (which imports them); and the installed version of another distribution."""

from importlib import metadata

__version__ = "0.1.0"


def installed_version(distribution: str) -> str | None:
    """``distribution``'s installed version; None when it is not installed (or imported from a source
    tree without metadata)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
