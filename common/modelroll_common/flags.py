"""Command-line helpers shared by modelroll's commands: MODELROLL_* defaults and number checks."""

from __future__ import annotations

import argparse
import os


def env(name: str, default: str | None = None) -> str | None:
    """The value of MODELROLL_<name>, the default for the flag of that name."""
    return os.environ.get(f"MODELROLL_{name}", default)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value
