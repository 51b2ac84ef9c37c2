"""Code the tests share; nothing here is collected as a test.

Tests import it one way, as the top-level package `helpers` (pyproject.toml's pytest `pythonpath`
puts tests/ on sys.path; see tests/conftest.py):

    from helpers.common import ROOT, free_port
    from helpers.launching import TINY, launch, records

workers/ holds scripts that multiprocess tests run as separate processes (by path, helpers.common.WORKERS).
"""
