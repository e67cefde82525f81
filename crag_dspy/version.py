"""The package version, in a module of its own: modules that record it import it without importing the
package root (which imports them)."""

__version__ = "0.1.0"
