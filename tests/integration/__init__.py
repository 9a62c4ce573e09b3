import pytest

# The shared live flow is not a test module: have pytest explain its failed asserts too.
pytest.register_assert_rewrite("tests.integration.live_flow")
