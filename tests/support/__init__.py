"""Test support code: servers that stand in for external systems and shared helpers.

Not shipped (``pyproject.toml`` packages ``gateway``, ``tenancy``, ``policy``,
``audit`` and ``sim`` only).
"""
