#!/bin/sh
# Chromium for the browser tier: Debian's package, installed when it is missing and this
# machine can (root and apt-get). When it cannot, say why and carry on: the tests then skip
# with that message, or fail when CI=true.
set -u
for name in "${SPECLANE_CHROMIUM:-}" chromium chromium-browser; do
  if [ -n "$name" ] && command -v "$name" >/dev/null 2>&1; then
    exit 0
  fi
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium from Debian's packages"
  if apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; then
    exit 0
  fi
fi
echo "chromium is missing and cannot be installed here (needs root and apt-get)" >&2
exit 0
