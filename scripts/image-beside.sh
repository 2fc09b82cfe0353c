#!/usr/bin/env bash
# Runs the command given (`make test`: the .venv install, then pytest) with the image that
# tests/test_image.py runs building beside it from the start, when this user can build one
# (podman and root, as that test needs). Both the install and the build are mostly one
# process's work, so on 2 cores they overlap instead of following each other; the test's own
# `make image` waits for this build (scripts/build-image.sh builds one at a time) and then
# finds every layer cached. A failed build is reported by that test, which builds again.
# The build's log is build/image.log; it stops when the command does.
#
#   bash scripts/image-beside.sh COMMAND [ARG...]
set -uo pipefail
cd "$(dirname "$0")/.."
if command -v podman >/dev/null && [ "$(id -u)" -eq 0 ]; then
    mkdir -p build
    echo "building the image in the background (log: build/image.log)" >&2
    # Its own process group, so that stopping it stops podman too.
    setsid make --no-print-directory image >build/image.log 2>&1 </dev/null &
    build=$!
    trap 'kill -TERM -- -$build 2>/dev/null; wait $build 2>/dev/null' EXIT
    trap 'exit 130' INT TERM
fi
"$@"
