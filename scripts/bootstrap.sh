#!/usr/bin/env bash
# Creates (or reuses) the project virtual environment .venv with a working fairseq stack.
# Idempotent: a stamp records a hash of the files that define the environment and of the settings below;
# unchanged -> nothing to do.
#
# Settings (environment variables; docs/installation.md):
#   NAT_KD_TORCH=pinned (default)  torch 2.13.0 and the versions of scripts/constraints.txt, from the index
#   NAT_KD_TORCH=system            the torch that $NAT_KD_PYTHON already has (a GPU image's, a cluster
#                                  module's): the venv sees that Python's packages and installs nothing over them
#   NAT_KD_PYTHON                  the Python the venv is made from (default python3)
#   NAT_KD_FAIRSEQ_WHEEL           a fairseq-fixed wheel built before against the same torch: installed instead
#                                  of building fairseq (each build keeps its wheel in .venv/wheels/)
#   NAT_KD_VENV                    where the venv goes (default .venv in the checkout)
# Offline: pip's own PIP_NO_INDEX=1 and PIP_FIND_LINKS=DIR (a folder of wheels) reach every pip call here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NAT_KD_VENV:-$root/.venv}"
python="${NAT_KD_PYTHON:-python3}"
mode="${NAT_KD_TORCH:-pinned}"
wheel="${NAT_KD_FAIRSEQ_WHEEL:-}"
say() { echo "[bootstrap] $*" >&2; }
fail() { say "$*"; exit 2; }

case "$mode" in
  pinned|system) ;;
  *) fail "NAT_KD_TORCH=$mode: use 'pinned' (torch 2.13.0 from the package index) or 'system' (the torch $python already has)" ;;
esac
stamp="$venv/.nat-kd-stamp"
want="$( (cat "$root/scripts/bootstrap.sh" "$root/scripts/constraints.txt" "$root/setup.cfg" "$root/pyproject.toml"
          echo "$mode $python $wheel") 2>/dev/null | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
  || fail "nat-kd needs Python 3.10 or newer: $python is $("$python" --version 2>&1); set NAT_KD_PYTHON to another"
if [[ "$mode" == system ]]; then
  system_torch="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
    || fail "NAT_KD_TORCH=system: $python cannot import torch; set NAT_KD_PYTHON to the Python that has it"
fi
if [[ -n "$wheel" && ! -f "$wheel" ]]; then
  fail "NAT_KD_FAIRSEQ_WHEEL=$wheel: no such file; unset it to build fairseq here"
fi
say "setting up $venv with torch ${system_torch:-2.13.0} ($mode; first run: about 5 minutes on 2 idle cores)"
# A venv left by the other mode holds the other torch: start it again rather than mix the two.
had="$(sed -n 's/^# nat-kd torch: //p' "$venv/pyvenv.cfg" 2>/dev/null | tail -n 1 || true)"
clear=()
[[ -f "$venv/pyvenv.cfg" && "${had:-pinned}" != "$mode" ]] && clear=(--clear)
# A Python without ensurepip (Debian's without python3-venv, some images) makes a venv without pip: that
# Python's own pip then installs into it.
if "$python" -m venv "${clear[@]}" "$venv" 2>/dev/null; then
  pip_of_venv=("$venv/bin/python" -m pip)
else
  "$python" -m venv "${clear[@]}" --without-pip "$venv" \
    || fail "$python cannot make a venv; install its venv module (Debian: python3-venv)"
  "$python" -m pip --version >/dev/null 2>&1 || fail "$python has neither ensurepip nor pip; install python3-venv"
  pip_of_venv=("$python" -m pip --python "$venv/bin/python")
fi
echo "# nat-kd torch: $mode" >> "$venv/pyvenv.cfg"
if [[ "$mode" == system ]]; then
  # The system Python's own site folders, after the venv's: what pip installs here never shadows torch, since
  # nothing that needs another torch is asked for. A .pth, not --system-site-packages, because that Python
  # may itself be a venv (NGC-style images), whose packages --system-site-packages would not see.
  "$python" -c 'import site, sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_nat_kd_system_site.pth"
fi

pip=("${pip_of_venv[@]}" install --quiet --disable-pip-version-check)
# pinned: every version from scripts/constraints.txt; system: whatever the system has that satisfies setup.cfg
constraints=()
[[ "$mode" == pinned ]] && constraints=(-c "$root/scripts/constraints.txt")
"${pip[@]}" "${constraints[@]}" "pip>=23" "cython<3.1" "setuptools<81"
[[ "$mode" == pinned ]] && "${pip[@]}" "${constraints[@]}" torch numpy

# fairseq's PyPI sdist does not build on Python 3.11; fairseq-fixed is the same code with the fixes. Built here
# against the torch above (no build isolation) and without its deps (no torchaudio, no second torch); from
# source (--no-binary), since the wheels on the index were compiled against another torch and numpy, and not
# from pip's cache (--no-cache-dir), which keys a built wheel by fairseq's version alone, not torch's.
# CUDA_HOME unset: only the CPU extensions (the CUDA ones serve models this project does not use).
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  if [[ -z "$wheel" ]]; then
    say "building fairseq-fixed 0.12.3.1 (about 3 minutes on 2 cores; its wheel is kept in $venv/wheels)"
    env -u CUDA_HOME MAX_JOBS="$(nproc)" "${pip_of_venv[@]}" wheel --quiet --disable-pip-version-check \
      --no-build-isolation --no-deps --no-cache-dir --no-binary fairseq-fixed -w "$venv/wheels" "fairseq-fixed==0.12.3.1"
    wheel="$(ls "$venv"/wheels/fairseq_fixed-0.12.3.1-*.whl | head -n 1)"
  fi
  "${pip[@]}" --no-deps "$wheel"
fi
# Everything else from setup.cfg; torch and fairseq are already satisfied.
"${pip[@]}" "${constraints[@]}" --no-build-isolation -e "$root[test]"
say "pip's note that fairseq-fixed wants torchaudio is expected: translation does not need it, and it would" \
    "pull another torch (docs/installation.md)"
if [[ "$mode" == system ]]; then
  now="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  [[ "$now" == "$system_torch" ]] || fail "the venv's torch is $now, not the system's $system_torch: a package asked for another"
fi
"$venv/bin/python" -c 'import torch, fairseq
print(f"[bootstrap] ready: torch {torch.__version__} (CUDA: {torch.cuda.is_available()}), fairseq {fairseq.__version__}")' >&2
echo "$want" > "$stamp"
