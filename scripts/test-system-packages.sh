#!/usr/bin/env bash
# The system packages `make test` needs beyond .venv: Chromium renders the run report
# (tests/test_report.py) and a Java 17 runtime runs Spark (tests/test_spark.py). Missing ones
# are installed when this user may (root, or sudo without a password); otherwise this stops
# with one line saying which packages and the command that installs them. The image's tools
# (podman, buildah, mmdebstrap, runc: tests/test_image.py builds and runs the image) are
# installed too when this user may; without them that test is skipped, in one line.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
optional=()
for tool in podman buildah mmdebstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || optional+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
elif [ ${#missing[@]} -eq 0 ]; then
  exit 0
else
  echo "make test needs the system packages ${missing[*]}; install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing the system packages the tests need: ${missing[*]} ${optional[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" \
  "${optional[@]}" >/dev/null
