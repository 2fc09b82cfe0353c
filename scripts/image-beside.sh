#!/usr/bin/env bash
# Runs the command given (`make test`: the .venv install, then pytest) with the image that
# tests/test_image.py runs building beside it from the start, when this user can build one
# (podman and root, as that test needs). Both the install and the build are mostly one
# process's work, so on 2 cores they overlap instead of following each other. The build's
# exit status goes to build/image.status, named to the command as IMAGE_BUILT_BESIDE: the
# image tests wait for it and use the image it built, or build again (and report the
# failure) when it failed. (A second `make image` that finds every layer cached still
# costs a minute of CPU: podman hashes the 2.5 GB venv again to check its copy.)
# The build's log is build/image.log; it stops when the command does.
#
#   bash scripts/image-beside.sh COMMAND [ARG...]
set -uo pipefail
cd "$(dirname "$0")/.."
if command -v podman >/dev/null && [ "$(id -u)" -eq 0 ]; then
    mkdir -p build
    echo "building the image in the background (log: build/image.log)" >&2
    rm -f build/image.status
    # Its own process group, so that stopping it stops podman too.
    setsid sh -c 'make --no-print-directory image >build/image.log 2>&1 </dev/null
                  echo $? >build/image.status.new
                  mv build/image.status.new build/image.status' &
    build=$!
    export IMAGE_BUILT_BESIDE=$PWD/build/image.status
    trap 'kill -TERM -- -$build 2>/dev/null; wait $build 2>/dev/null' EXIT
    trap 'exit 130' INT TERM
fi
"$@"
