"""`python -m modelroll_operator` runs the operator (same as `modelroll-operator`)."""

from .cli import main

if __name__ == "__main__":
    main()
