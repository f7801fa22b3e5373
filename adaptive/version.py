"""The package version (one place: read by the package, packs and the CLI)."""

__version__ = "0.1.0"
