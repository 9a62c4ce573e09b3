"""Unit tests of the session layer."""
