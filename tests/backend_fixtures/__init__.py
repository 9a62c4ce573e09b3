"""One module per backend configuration, each giving the conformance suite its backend.

A module here defines `BACKEND`, a `sandbox.testing.conformance.Backend`: its name (the
id of the parametrized tests), its capabilities, why it cannot run here
(`skip_reason`), and its session factory, made by `conformance.fixture_session` from
the module's backend-specific part: an async context manager that sets up what the
backend needs, yields an unstarted session and, once the suite closed it, checks what
the backend left behind.

Modules are discovered automatically; `SANDBOX_CONFORMANCE_BACKENDS=a,b` restricts the
suite to some of them. With `SANDBOX_REQUIRE_ALL=1` (set by CI) a backend that would be
skipped fails instead.
"""
