#!/usr/bin/env bash
# A folder of wheels for setting up on a machine with no network whose Python already holds a CUDA torch (an
# NGC-style image, a cluster module): run it where the package index is reachable, copy DIR over, then there
#   NAT_KD_TORCH=system PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR NAT_KD_FAIRSEQ_WHEEL=DIR/fairseq_fixed-*.whl \
#       bash scripts/main.sh                                    (docs/installation.md, "On a GPU")
#
#   bash scripts/setup/offline_wheels.sh DIR PYTHON TORCH_VERSION [--strip]
# PYTHON: an interpreter of the target machine's Python version (e.g. python3.12), used to build fairseq-fixed
# against TORCH_VERSION (the target's torch, e.g. 2.11.0: `python3 -c "import torch; print(torch.__version__)"`
# there, without its +cu suffix). The build installs that torch in a scratch venv (from the index, a few GB).
# --strip: debug symbols out of the compiled libraries, which halves the folder (for size-limited transfers).
# The folder holds what such images usually lack: fairseq's runtime dependencies, CTranslate2, the project's
# small ones and pytest's; an image without numpy, matplotlib, scikit-learn, sentencepiece or transformers
# needs those too (pip download them into DIR the same way).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="${1:?usage: offline_wheels.sh DIR PYTHON TORCH_VERSION [--strip]}"
python="${2:?}"
torch_version="${3:?}"
strip="${4:-}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
version="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
pins() { grep -E "^($1)==" "$root/scripts/constraints.txt"; }
# versions: setup.cfg's own pins, and scripts/constraints.txt's for the ranges
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  "${platforms[@]}" -d "$dir" \
  bitarray==3.12.3 hydra-core==1.3.2 omegaconf==2.3.0 sacremoses==0.1.1 subword-nmt==0.3.8 mock submitit==1.5.4 \
  "cython<3.1" "setuptools<81" pycparser $(pins "ctranslate2|sacrebleu|cffi|pytest|pytest-xdist") \
  pluggy iniconfig execnet portalocker tabulate colorama packaging regex tqdm click joblib cloudpickle \
  typing_extensions pyyaml
python3 -m pip wheel --quiet --no-deps -w "$dir" antlr4-python3-runtime==4.9.3  # an sdist only: built here

# fairseq-fixed, built against the target's torch version with the target's Python
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "torch==$torch_version" "numpy>=2" "cython<3.1" "setuptools<81" wheel
env -u CUDA_HOME MAX_JOBS="$(nproc)" "$work/venv/bin/python" -m pip wheel --quiet --no-build-isolation --no-deps \
  --no-cache-dir --no-binary fairseq-fixed -w "$work/built" "fairseq-fixed==0.12.3.1"
if [[ "$strip" == --strip ]]; then
  for wheel in "$work"/built/fairseq_fixed-*.whl "$dir"/ctranslate2-*.whl; do
    rm -rf "$work/unpacked"
    "$work/venv/bin/python" -m wheel unpack -d "$work/unpacked" "$wheel" > /dev/null
    find "$work/unpacked" -name "*.so*" -type f -exec strip --strip-debug {} +
    rm "$wheel"
    "$work/venv/bin/python" -m wheel pack -d "$(dirname "$wheel")" "$work"/unpacked/* > /dev/null
  done
fi
mv "$work"/built/fairseq_fixed-*.whl "$dir"/
ls -la "$dir"
