#!/usr/bin/env bash
# The test suite, from nothing: sets up .venv once (scripts/bootstrap.sh), then runs pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k prepare` (`-n 0` for one process).
# The test files run on one worker a core (at most 4), each file whole on one worker, so that a module's
# fixtures (a trained micro teacher, say) are built once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 --dist loadfile "$@"
