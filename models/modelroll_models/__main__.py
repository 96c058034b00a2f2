"""``python -m modelroll_models``: the same as ``modelroll-encoder``."""

from .cli import main

main()
