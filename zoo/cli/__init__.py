"""Command-line entry points, one module per command, each with a `main(argv=None) -> int`; installed as
console scripts (zoo-train, zoo-sample, ...) and runnable as `python -m zoo.cli.<command>`. Arguments
are parsed before jax is imported, and bad input ends in one `error:` line with exit code 2."""

from __future__ import annotations

import sys

# What a command reports as one `error:` line: zoo's own errors (ZooError is a ValueError) and missing files.
BAD_INPUT = (ValueError, FileNotFoundError)


def error(e: BaseException) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 2
