"""The `spotrelay` command line."""

from spotrelay.cli.app import app, main

__all__ = ["app", "main"]
