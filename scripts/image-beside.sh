#!/usr/bin/env bash
# Runs the command given (`make test`: the .venv install, then pytest) with the image that
# tests/test_image.py runs building beside it from the start, when this user can build one
# (podman and root, as that test needs). Both the install and the build are mostly one
# process's work, so on 2 cores they overlap instead of following each other. The build's
# exit status goes to build/image.status, named to the command as IMAGE_BUILT_BESIDE: the
# image tests wait for it and use the image it built, or build again (and report the
# failure) when it failed. (A second `make image` that finds every layer cached still
# costs a minute of CPU: podman hashes the 2.5 GB venv again to check its copy.)
# The GPU image (`make image-gpu`) builds next, in the same background job, reusing the base
# and the JRE's layer: its status goes to build/image-gpu.status, named as
# IMAGE_GPU_BUILT_BESIDE, for its tests, which run after the CPU image's (IMAGE_GPU_BESIDE=0
# leaves it to them). The builds' logs are build/image.log and build/image-gpu.log; they stop
# when the command does.
#
#   bash scripts/image-beside.sh COMMAND [ARG...]
set -uo pipefail
cd "$(dirname "$0")/.."
if command -v podman >/dev/null && [ "$(id -u)" -eq 0 ]; then
    mkdir -p build
    echo "building the images in the background (build/image.log, build/image-gpu.log)" >&2
    rm -f build/image.status build/image-gpu.status
    # Its own process group, so that stopping it stops podman too.
    setsid sh -c 'make --no-print-directory image >build/image.log 2>&1 </dev/null
                  echo $? >build/image.status.new
                  mv build/image.status.new build/image.status
                  [ "${IMAGE_GPU_BESIDE:-1}" = 1 ] || exit 0
                  make --no-print-directory image-gpu >build/image-gpu.log 2>&1 </dev/null
                  echo $? >build/image-gpu.status.new
                  mv build/image-gpu.status.new build/image-gpu.status' &
    build=$!
    export IMAGE_BUILT_BESIDE=$PWD/build/image.status
    if [ "${IMAGE_GPU_BESIDE:-1}" = 1 ]; then
        export IMAGE_GPU_BUILT_BESIDE=$PWD/build/image-gpu.status
    fi
    trap 'kill -TERM -- -$build 2>/dev/null; wait $build 2>/dev/null' EXIT
    trap 'exit 130' INT TERM
fi
"$@"
