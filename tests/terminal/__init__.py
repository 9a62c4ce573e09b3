"""Unit tests of the terminal layer (screens, recordings)."""
