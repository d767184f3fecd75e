"""Test support: real servers for the integration tests (Milvus standalone, PostgreSQL by URL).

The fixtures live in :mod:`tests.support.fixtures`; ``tests/conftest.py`` loads them as a pytest plugin.
"""
