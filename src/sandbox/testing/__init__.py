"""Fakes and protocol servers for provider-free tests of code that uses `sandbox`.

Submodules are imported on demand, so importing `sandbox.testing` needs no provider SDK:
`sandbox.testing.drift` checks a fake against the real SDK's surface; the provider fakes
and servers live in their own modules.
"""
