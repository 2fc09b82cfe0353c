#!/usr/bin/env bash
# Builds the pipeline's image (`make image`) with podman, or docker when podman is missing.
#
#   IMAGE=tfrecord-pipeline IMAGE_TAG=0.1.0 bash scripts/build-image.sh [extra build flags]
#
# `make image-gpu` builds the GPU image with it: IMAGE_TAG=<tag>-gpu and the extra flags
# --build-arg 'TF_PACKAGE=tensorflow[and-cuda]' (the Dockerfile says what that installs).
#
# Settings (environment):
#   IMAGE, IMAGE_TAG  the tag to build (default tfrecord-pipeline:0.1.0, as pipeline/configs.py)
#   ENGINE            podman or docker (default: podman when installed, else docker)
#   BASE_IMAGE        a Debian 12 (bookworm) image (default docker.io/library/debian:bookworm-slim).
#                     With podman, when the default cannot be pulled (no registry reachable),
#                     a base is made from Debian's archive with mmdebstrap and tagged
#                     LOCAL_BASE (default localhost/tfrp-base:bookworm); it is reused after.
#   IMAGE_LOCK        the file a build holds locked, so builds in this checkout run one at a time
#                     (default build/image.lock)
#   PIP_FROM_HOST     1 (default with podman): pip in the build uses this machine's pip index
#                     settings (index-url, extra-index-url, find-links), their local folders
#                     mounted read-only; 0: plain PyPI (or the PIP_INDEX_URL,
#                     PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS given in the environment, passed on).
#                     With podman, pip's CA bundle setting (`cert`) is passed either way.
# The build uses the host's network (pip); containers run from the image need none.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-tfrecord-pipeline}
IMAGE_TAG=${IMAGE_TAG:-0.1.0}
DEFAULT_BASE=docker.io/library/debian:bookworm-slim
BASE_IMAGE=${BASE_IMAGE:-$DEFAULT_BASE}
LOCAL_BASE=${LOCAL_BASE:-localhost/tfrp-base:bookworm}
if [ -z "${ENGINE:-}" ]; then
    if command -v podman >/dev/null; then ENGINE=podman; else ENGINE=docker; fi
fi
say() { echo "build-image: $*" >&2; }
if ! command -v "$ENGINE" >/dev/null; then
    say "neither podman nor docker is installed: apt-get install podman buildah mmdebstrap runc (docs/DEPLOYMENT.md)"
    exit 1
fi
if [ "$ENGINE" = docker ] && ! docker info >/dev/null 2>&1; then
    say "docker is installed but no Docker daemon answers: start it (sudo systemctl start docker), or build with podman, which needs no daemon: apt-get install podman buildah mmdebstrap runc (docs/DEPLOYMENT.md)"
    exit 1
fi

# One build at a time in this checkout: `make test` starts one in the background
# (scripts/image-beside.sh) that the image tests' own `make image` then waits for, and finds
# cached, instead of building the same layers again beside it.
IMAGE_LOCK=${IMAGE_LOCK:-build/image.lock}
mkdir -p "$(dirname "$IMAGE_LOCK")"
exec 9>"$IMAGE_LOCK"
flock 9

build_args=()
if [ "$ENGINE" = podman ]; then
    # runc and the ulimits this machine needs (scripts/containers.conf says why).
    if [ -z "${CONTAINERS_CONF:-}" ] && command -v runc >/dev/null; then
        export CONTAINERS_CONF=$PWD/scripts/containers.conf
    fi
    if ! podman image exists "$BASE_IMAGE" && ! podman pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
        if [ "$BASE_IMAGE" != "$DEFAULT_BASE" ]; then
            say "cannot pull $BASE_IMAGE"; exit 1
        fi
        if ! podman image exists "$LOCAL_BASE"; then
            command -v mmdebstrap >/dev/null || {
                say "cannot pull $BASE_IMAGE and mmdebstrap is not installed (apt-get install mmdebstrap)"
                exit 1; }
            say "cannot pull $BASE_IMAGE: making $LOCAL_BASE from Debian's archive (mmdebstrap)"
            tmp=$(mktemp -d)
            trap 'rm -rf "$tmp"' EXIT
            # bookworm's python3 is 3.11; docs and man pages left out as in debian:*-slim.
            mmdebstrap --variant=minbase --include=python3.11,python3-venv,ca-certificates \
                --dpkgopt='path-exclude=/usr/share/man/*' \
                --dpkgopt='path-exclude=/usr/share/doc/*' \
                --dpkgopt='path-include=/usr/share/doc/*/copyright' \
                --dpkgopt='path-exclude=/usr/share/locale/*' \
                bookworm "$tmp/base.tar" \
                "deb http://deb.debian.org/debian bookworm main" \
                "deb http://deb.debian.org/debian bookworm-updates main" \
                "deb http://deb.debian.org/debian-security bookworm-security main"
            podman image import -q \
                --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
                --change 'CMD ["/bin/bash"]' \
                --message "mmdebstrap bookworm minbase + python3.11" \
                "$tmp/base.tar" "$LOCAL_BASE" >/dev/null
        fi
        say "base: $LOCAL_BASE (made with mmdebstrap; $BASE_IMAGE could not be pulled)"
        BASE_IMAGE=$LOCAL_BASE
    fi
    # This machine's pip settings (pip.conf and PIP_* variables), as `pip config list` shows
    # them. The CA bundle (`cert`: a TLS-intercepting proxy's CA) is always passed, mounted
    # read-only; the indexes and find-links with PIP_FROM_HOST=1, their local folders mounted
    # read-only at the same paths.
    . scripts/pip-settings.sh
    py=$(command -v python3 || true)
    conf=$([ -n "$py" ] && "$py" -m pip config list 2>/dev/null || true)
    for key in cert index-url extra-index-url find-links; do
        value=$(pip_setting "$conf" "$key")
        [ -n "$value" ] || continue
        if [ "$key" = cert ]; then
            [ -f "$value" ] || continue
            build_args+=(--volume "$(readlink -f "$value"):/run/host-pip-cert.pem:ro"
                         --build-arg PIP_CERT=/run/host-pip-cert.pem)
            continue
        fi
        [ "${PIP_FROM_HOST:-1}" = 1 ] || continue
        var=PIP_$(echo "$key" | tr a-z- A-Z_)
        build_args+=(--build-arg "$var=$value")
        for location in $value; do
            dir=${location#file://}
            case "$dir" in /*) ;; *) continue ;; esac
            while [ ! -d "$dir" ] && [ "$dir" != / ]; do dir=$(dirname "$dir"); done
            # The folder holding a simple index also holds the files it links to.
            [ "$(basename "$dir")" = simple ] && dir=$(dirname "$dir")
            [ -d "$dir" ] && [ "$dir" != / ] && build_args+=(--volume "$dir:$dir:ro")
        done
    done
fi
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS; do
    if [ -n "${!var:-}" ] && [ "${PIP_FROM_HOST:-1}" = 0 -o "$ENGINE" = docker ]; then
        build_args+=(--build-arg "$var=${!var}")
    fi
done

say "$ENGINE build $IMAGE:$IMAGE_TAG from $BASE_IMAGE"
exec "$ENGINE" build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" "${build_args[@]}" \
    -t "$IMAGE:$IMAGE_TAG" "$@" .
