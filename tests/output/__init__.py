"""Unit tests of the output layer."""
