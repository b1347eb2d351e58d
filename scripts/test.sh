#!/usr/bin/env bash
# The test suite, from nothing: sets up .venv once (scripts/bootstrap.sh), then runs pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k prepare`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
