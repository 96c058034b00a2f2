"""`python -m modelroll_gateway` runs the gateway (same as `modelroll-gateway`)."""

from .cli import main

if __name__ == "__main__":
    main()
