#!/usr/bin/env bash
# Runs radixkvd from a fresh Debian 12 checkout: installs the dependencies,
# configures and builds radixkvd, and beside it radixkvctl and
# radixkv-worker (CMake preset "default"; README's next commands run them
# from build/default), then execs radixkvd in the foreground on its default
# configuration (1 GiB host pool, the per-user Unix socket, metrics on
# 127.0.0.1:9464). It prints where it listens.
# Extra arguments go to radixkvd, e.g.
#   scripts/run_daemon.sh --pool=none,pages=100000 --listen_tcp=127.0.0.1:50051 --insecure_tcp
# Ctrl-C (SIGINT) or SIGTERM drains and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --no-python
cmake --preset default >/dev/null
cmake --build --preset default --target radixkvd radixkvctl radixkv-worker
exec build/default/daemon/radixkvd "$@"
