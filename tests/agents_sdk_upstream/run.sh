#!/usr/bin/env bash
# The OpenAI Agents SDK's own sandbox tests against our SandboxClient (`make test-agents-sdk`):
# fetch the sdist of the version constraints.txt pins, unpack it under build/, run its
# tests/sandbox files named below once per backend with our plugin (plugin.py) rebinding
# the names they build clients and sessions from. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=$PWD
python=${PYTHON:-$here/.venv/bin/python}
pin=$(sed -n 's/^openai-agents==//p' constraints.txt)
[ -n "$pin" ] || { echo "constraints.txt pins no openai-agents version" >&2; exit 2; }
dir=$here/build/agents-sdk-$pin
if [ ! -f "$dir/.unpacked" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    "$python" -m pip download -q --no-deps --no-binary :all: -d "$dir" "openai-agents==$pin"
    tar -xzf "$dir/openai_agents-$pin.tar.gz" -C "$dir" --strip-components=1
    touch "$dir/.unpacked"
fi
# The upstream files whose tests build a unix_local client or session (the list in
# upstream_tests.txt says which of their tests apply).
files=(
    tests/sandbox/test_unix_local.py
    tests/sandbox/test_unix_local_file_io.py
    tests/sandbox/test_unix_local_special_files.py
    tests/sandbox/test_unix_local_user_file_io.py
    tests/sandbox/test_unix_local_create.py
    tests/sandbox/test_exposed_ports.py
    tests/sandbox/test_run_cwd.py
    tests/sandbox/test_bounded_read.py
    tests/sandbox/test_workspace_jsonl_sink.py
    tests/sandbox/test_extract.py
    tests/sandbox/test_snapshot.py
    tests/sandbox/test_session_manager.py
    tests/sandbox/test_recursive_removal_compatibility.py
    tests/sandbox/test_posix_tool_paths.py
    tests/sandbox/test_client_options.py
    tests/sandbox/test_compatibility_guards.py
    tests/sandbox/capabilities/test_filesystem_capability.py
    tests/sandbox/integration_tests/test_runner_pause_resume.py
)
status=0
for backend in ${AGENTS_SDK_BACKENDS:-unix_local docker}; do
    echo "== the SDK's sandbox tests on $backend"
    (cd "$dir" && PYTHONPATH="$here/tests/agents_sdk_upstream" "$python" -m pytest -q \
        -p plugin -p no:cacheprovider --agents-sdk-backend="$backend" "${files[@]}" "$@") \
        || status=1
done
exit $status
