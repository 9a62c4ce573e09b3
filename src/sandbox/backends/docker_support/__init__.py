"""The parts of the `docker` backend, one idea per module.

`frames` decodes the multiplexed stdout/stderr stream of a non-tty exec; `stream` reads
and writes an exec's hijacked socket with the event loop; `engine` owns the SDK client,
its thread pool and the container's event stream; `execs` runs one exec (create,
start, exit detection, the tag-based kill); `archive` streams files in and out through
tar; `errors` maps the SDK's exceptions onto ours. Only `sandbox.backends.docker` imports
them, so importing `sandbox` never imports the docker SDK.
"""
