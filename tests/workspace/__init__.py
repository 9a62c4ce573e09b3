"""Tests of the workspace archives: the tar reader, the extractor, the writer."""
