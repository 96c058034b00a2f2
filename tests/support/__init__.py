"""What the tests share: helpers that tests in several files or tiers import. No test module
imports another; each tier's conftest.py holds its fixtures and imports what they need from
here."""
