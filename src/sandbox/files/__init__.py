"""File calls: the checks every backend shares, and files the host creates.

- `arguments`: file-call arguments (paths without NUL, read limits, chunk sizes and
  sources).
- `remote`: what a path names on a provider (`Entry`, `regular_file`: stat first) and
  the errors and bounded reads the remote backends share.
- `host`: files the host creates on the sandbox's behalf (recordings): exclusive
  create relative to a folder fd, a walk that follows no symlink.
"""
