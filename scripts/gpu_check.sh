#!/usr/bin/env bash
# The GPU check, on a machine whose Python already holds a CUDA torch (docs/installation.md, "On a GPU"),
# offline: the set-up from a folder of wheels and the CUDA tests, the main job, CTranslate2 on this CUDA, the
# generator against fairseq-generate, and the training benchmark, each phase timed, within a budget.
#   bash scripts/gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]
# WHEELS: the wheels the machine lacks, a built fairseq-fixed among them (docs/installation.md says which);
# DATA: the raw Multi30k folder; OUT: logs, the benchmarks' results.json files, gpu.csv and summary.txt.
# PHASES: any of setup main generate training (default: all, in this order); generate and training need the
# main job's teacher and data, from this call or an earlier one in the same checkout. On a 16-core H100 the
# first three took 455 s (docs/results/gpu/README.md), so training gets a call of its own. A phase starts
# only while the budget lasts; the training benchmark stops at its deadline.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
wheels="$(cd "${1:?usage: gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]}" && pwd)"
data="$(cd "${2:?}" && pwd)"
out="${3:?}"
budget="${4:-540}"
phases=" ${*:5} "
[[ "$phases" == "  " ]] && phases=" setup main generate training "
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
export NAT_KD_TORCH=system PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" NAT_KD_DATA="$data" PYTHONUNBUFFERED=1
built="$(ls "$wheels"/fairseq_fixed-*.whl 2>/dev/null | head -n 1)"
[[ -n "$built" ]] && export NAT_KD_FAIRSEQ_WHEEL="$built"

wanted() { [[ "$phases" == *" $1 "* ]]; }
note() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$summary"; }
phase() {  # phase NAME COMMAND...: runs it with its output in OUT/NAME.log, and notes its time and exit code
  local name="$1" start=$SECONDS
  shift
  note "$name: start"
  "$@" > "$out/$name.log" 2>&1
  local code=$?
  note "$name: exit $code after $((SECONDS - start)) s"
  return $code
}
left() { echo $((budget - SECONDS)); }

# the GPU's use and memory every second, for each phase's share (the phases' clock times are in summary.txt)
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$out/gpu.csv" 2>&1 &
sampler=$!
trap 'kill "$sampler" 2>/dev/null' EXIT
note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1); cores: $(nproc)"
if wanted setup; then
  phase tests bash scripts/test.sh -k "cuda or gpu_decodes"
  grep -E "passed|failed|error" "$out/tests.log" | tail -n 3 | tee -a "$summary"
else
  bash scripts/bootstrap.sh
fi
.venv/bin/python -c 'import torch, numpy, fairseq, sacrebleu, ctranslate2
print("versions: torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "fairseq",
      fairseq.__version__, "sacrebleu", sacrebleu.__version__, "ctranslate2", ctranslate2.__version__)' 2>&1 \
  | tail -n 1 | tee -a "$summary"
source .venv/bin/activate
teacher=runs/multi30k.en-de/teacher_tiny/checkpoint_best.pt

if wanted main; then
  phase main_job bash scripts/main.sh
  grep -E "^== |BLEU = |done training" "$out/main_job.log" | head -n 20 >> "$summary"
  python -c 'import json, sys
timing = json.load(open(sys.argv[1]))["timing"]
print("main job distillation:", {k: timing.get(k) for k in ("wall_seconds", "decode_wall_seconds",
                                                            "sentences_per_second", "workers", "device")})' \
    runs/multi30k.en-de/distill/beam5/meta.json | tee -a "$summary"
  # CTranslate2 on this machine's CUDA: decodes, or says in one line what is missing
  phase ctranslate2 python -m nat_kd.generate_distilled --teacher-path "$teacher" \
    --prepared "$(ls -d data/multi30k.en-de.* | head -n 1)" --split valid --backend ctranslate2 --device cuda \
    --out /tmp/gpu_check.ct2.valid --ct2-cache /tmp/gpu_check.ct2-cache
  tail -n 2 "$out/ctranslate2.log" >> "$summary"
fi
prepared="$(ls -d data/multi30k.en-de.* | head -n 1)"

bench_generate() {  # the generator against fairseq-generate on the first 10,000 training sentences
  phase "generate_$1" python scripts/bench_generate.py --teacher-path "$teacher" --prepared "$prepared" \
    --split train --limit 10000 --beam 5 --max-tokens "$2" --repeats 1 --skip-default-count --device cuda "${@:3}"
  grep -E "identical|sent/s|speed vs" "$out/generate_$1.log" >> "$summary"
}
if wanted generate; then
  bench_generate fp32.12000 12000
  (( $(left) > 60 )) && bench_generate fp16.12000 12000 --fp16
  (( $(left) > 60 )) && bench_generate fp16.32000 32000 --fp16
fi

# training: 6x512 with 16k-token batches, every studied family and the transformer; fp16, and fp32 beside it
deadline=$(( $(left) - 70 ))
if wanted training && (( deadline > 60 )); then
  phase training python scripts/bench_training.py --data "$prepared/bin" --out "$out/training" \
    --models nat glat glat_ctc dat transformer --shapes 6x512:16384 --precisions fp16 fp32 \
    --warmup 30 --updates 100 --repeats 1 --deadline "$deadline"
  tail -n 14 "$out/training.log" >> "$summary"
fi
note "done; $(left) s of the budget left"
