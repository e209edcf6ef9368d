"""The package version, in a module of its own so nothing imports the package from below."""

__version__ = "0.1.0"
