"""The package's version: one string, read by setup.cfg (``attr:``) and the
command's ``--version`` without importing the package's ``__init__``."""

__version__ = "0.1.0"
