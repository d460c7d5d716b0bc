"""The package version: the one place it is written (``setup.cfg`` reads it with ``attr:``)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
