"""Unit tests of the toolkit layer."""
