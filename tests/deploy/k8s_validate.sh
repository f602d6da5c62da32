#!/usr/bin/env bash
# Validates the Kubernetes manifests under deploy/kubernetes (or MANIFEST_DIR)
# strictly against the Kubernetes and Prometheus Operator schemas, then the
# deployment's own rules, with negative controls: tests/deploy/k8s_validate.py
# says what is checked. It runs with the project's virtual environment,
# ${RADIXKV_VENV:-<checkout>/.venv} (scripts/install_deps.sh makes it).
#
# Usage: tests/deploy/k8s_validate.sh [MANIFEST_DIR] [--kubectl=PATH|--no-kubectl]
# Exit 77 (ctest: Skipped) when the environment or one of its packages is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${RADIXKV_VENV:-$(cd "$here/../.." && pwd)/.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "k8s_validate: $venv/bin/python missing; scripts/install_deps.sh makes the" \
       "virtual environment (or set RADIXKV_VENV); skipped" >&2
  exit 77
fi
exec "$venv/bin/python" "$here/k8s_validate.py" "$@"
