"""The cross-backend conformance suite: every backend must pass all of it.

The tests are `sandbox.testing.conformance.suite`, the public checker an out-of-tree
backend runs against itself; here `conformance_backend` (tests/conftest.py) is
parametrized over the backends of tests/backend_fixtures/.
"""

from sandbox.testing.conformance.suite import *  # noqa: F403
