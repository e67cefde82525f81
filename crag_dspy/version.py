"""The package version, in a module of its own: modules that record it import it without importing the
package root (which imports them); and the installed version of another distribution."""

from importlib import metadata

# 0.2.0: chunks keep their PDF page or section (a store ingested by 0.1.0 is compared chunk by chunk
# once, crag_dspy.store.source_record, and re-chunked).
__version__ = "0.2.0"


def installed_version(distribution: str) -> str | None:
    """``distribution``'s installed version; None when it is not installed (or imported from a source
    tree without metadata)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
