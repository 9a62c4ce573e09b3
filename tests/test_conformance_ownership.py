"""Conformance: exactly one owner when a close races a creation, on every backend.

The tests are `sandbox.testing.conformance.ownership` (public, for out-of-tree backends
too); here `conformance_backend` (tests/conftest.py) is each backend of
tests/backend_fixtures/ in turn.
"""

from sandbox.testing.conformance.ownership import *  # noqa: F403
