"""One module per backend, each giving the conformance suite a way to open a session.

A module here defines:

- `NAME`: the backend name (the id of the parametrized test);
- `skip_reason() -> str | None`: why this backend cannot run here (None when it can);
- `session(tmp_path)`: an async context manager yielding a STARTED session, which it
  closes (and checks for leaks, where it can) on exit;
- `CAPABILITIES`: a set of strings among "resize", "signals" (the backend reports a
  signal death as 128+N) the suite may rely on.

Modules are discovered automatically; `SANDBOX_CONFORMANCE_BACKENDS=a,b` restricts the
suite to some of them. With `SANDBOX_REQUIRE_ALL=1` (set by CI) a backend that would be
skipped fails instead.
"""
