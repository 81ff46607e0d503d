"""Builders and clients the tests share (`from helpers.<module> import ...`; tests/ is on sys.path because
tests/conftest.py is loaded from it). Fixtures live in the conftest.py files, helpers here."""
