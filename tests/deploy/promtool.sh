#!/bin/sh
# promtool and prometheus for the dashboard's checks: Debian's package, installed when they
# are missing and this machine can (root and apt-get). When it cannot, say why and carry on:
# the tests then skip with that message, or fail when CI=true.
set -u
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing prometheus (promtool) from Debian's packages"
  if apt-get update -q >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; then
    exit 0
  fi
fi
echo "prometheus and promtool are missing and cannot be installed here (needs root and apt-get)" >&2
exit 0
