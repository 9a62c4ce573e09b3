"""The output pipeline: the bytes a process prints, made into text a model reads.

- `buffer`: `BoundedOutput`, a head, a rolling tail and the count of what was omitted.
- `decoding`: `StreamDecoder`, incremental UTF-8 per process, and the omission marker.
- `truncation`: `truncate_to_tokens`, a window's text cut to `max_output_tokens`.
- `until`: `UntilMatcher` and `check_until`, incremental `until` matching.

Internal: the names users see are re-exported by `sandbox` (`UntilPattern`).
"""
