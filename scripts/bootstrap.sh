#!/usr/bin/env bash
# Creates (or reuses) the project virtual environment .venv with a working fairseq stack.
# Idempotent: a stamp records a hash of the files that define the environment; unchanged -> nothing to do.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NAT_KD_VENV:-$root/.venv}"
stamp="$venv/.nat-kd-stamp"
want="$(cat "$root/scripts/bootstrap.sh" "$root/setup.cfg" "$root/pyproject.toml" 2>/dev/null | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "[bootstrap] setting up $venv (first run: about 5 minutes on 2 idle cores)" >&2
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade "pip>=23" wheel
# torch pinned first: an unpinned torch would pull a multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0" "numpy==1.26.4" "cython<3.1" "setuptools<81"
# fairseq's PyPI sdist does not build on Python 3.11; fairseq-fixed is the same code with the fixes.
# Build it against the torch above (no build isolation) and without its deps (no torchaudio, no second torch).
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "[bootstrap] building fairseq-fixed 0.12.3.1 (about 2.5 minutes)" >&2
  "${pip[@]}" --no-build-isolation --no-deps "fairseq-fixed==0.12.3.1"
fi
# Everything else, pinned in setup.cfg; fairseq and torch are already satisfied.
"${pip[@]}" -e "$root[test]"
echo "[bootstrap] pip's note that fairseq-fixed wants torchaudio is expected: translation does not need it," \
     "and it would pull another torch (docs/installation.md)" >&2
echo "$want" > "$stamp"
