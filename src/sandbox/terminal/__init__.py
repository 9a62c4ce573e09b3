"""What a tty looks like.

- `size`: `check_terminal_size` and `MAX_TERMINAL_SIDE`, the one rule for rows and
  columns (a leaf: it imports only `sandbox.errors`).
- `screen`: `TerminalScreen` and `ScreenSnapshot`, the rendered screen of a tty (pyte).
- `recording`: `AsciicastRecorder`, asciicast v2 files.

This `__init__` imports nothing, so `import sandbox` stays free of pyte until a screen
is made.
"""
