"""Fenced uses of other libraries' internals, one module per library.

Each module lists the internals it relies on and the version it is built on, checks them once
(:func:`missing` in each), falls back to the library's public API when one is gone, and has a
contract test in ``tests/gateway/test_compat.py`` that fails when one moves. Nothing outside
``gateway/compat/`` touches a library's private names.
"""
