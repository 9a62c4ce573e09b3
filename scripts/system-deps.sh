#!/usr/bin/env bash
# Installs the system packages the test suite uses when they are missing: bubblewrap (the
# confined unix_local jail), busybox-static (the Docker test image) and the full-screen
# programs of the rendered-screen tests (vim-tiny, less, procps for top, nano). Needs
# root and apt-get; elsewhere it says what is missing and the tests that need it skip (or
# fail, under SANDBOX_REQUIRE_ALL=1 as in CI).
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# The Docker test image needs the STATIC busybox (the dynamic `busybox` package also has
# /bin/busybox but cannot run in a FROM-scratch image).
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
# Full-screen programs the rendered-screen tests drive through a real PTY.
command -v vim.tiny >/dev/null 2>&1 || missing+=(vim-tiny)
command -v less >/dev/null 2>&1 || missing+=(less)
command -v top >/dev/null 2>&1 || missing+=(procps)
command -v nano >/dev/null 2>&1 || missing+=(nano)
# Shells the shell-toolkit matrix runs its scripts under (dash, bash and busybox ash are
# covered above or by the base system).
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v mksh >/dev/null 2>&1 || missing+=(mksh)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null || {
    echo "warning: could not install ${missing[*]}" >&2
    exit 0
  }
else
  echo "note: ${missing[*]} not installed (needs root + apt-get); tests that need them will skip" >&2
fi
exit 0
