#!/usr/bin/env bash
# The GPU check, on a machine whose Python already holds a CUDA torch (docs/installation.md, "On a GPU"),
# offline: each phase timed, within a budget, its output in OUT/PHASE.log and its times in OUT/summary.txt.
#   bash scripts/setup/gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]
# WHEELS: the wheels the machine lacks, a built fairseq-fixed among them (docs/installation.md says which);
# DATA: the raw Multi30k folder; OUT: logs, the benchmarks' results.json files, gpu.csv and summary.txt.
# PHASES, run in the order given (default: setup main training generate choose):
#   setup     the set-up from WHEELS and the GPU's own tests (-m gpu; without this phase, the set-up alone)
#   suite     the whole suite, the README's test command as it is (on the CPU but for the GPU's own tests)
#   main      the main job (bash scripts/main.sh), and CTranslate2 on this CUDA
#   training  scripts/benchmarks/bench_training.py: every family and fairseq's transformer, 6x512 with 16k-token batches,
#             fp32 and --fp16, until the budget's end
#   choose    python -m nat_kd.choose: GLAT pilots on the GPU, which train, exit and are scored as a user's
#   generate  scripts/benchmarks/bench_generate.py: the generator against fairseq-generate, with more workers sharing the
#             GPU, --fp16, bigger batches and batches sized to the GPU's free memory (--max-tokens auto)
#   student   a vanilla NAT student's fairseq-train on the distilled set, 300 updates: its exit status
# Environment: GPU_CHECK_TRAINING_SECONDS caps the training phase (to leave time for the phases after it);
# GPU_CHECK_VARIANTS replaces the generate phase's variants (NAME=ARGS;NAME=ARGS...).
# choose, generate and student need the main job's teacher and distilled set, from this call or an earlier one in the
# same checkout; training prepares the data if no phase did. A phase starts only while the budget lasts; the
# training benchmark stops at its deadline. Device time is scarce: docs/results/gpu/README.md says which
# calls fitted.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
wheels="$(cd "${1:?usage: gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]}" && pwd)"
data="$(cd "${2:?}" && pwd)"
out="${3:?}"
budget="${4:-540}"
phases=("${@:5}")
(( ${#phases[@]} )) || phases=(setup main training generate choose)
for name in "${phases[@]}"; do
  [[ " setup suite main training choose generate student " == *" $name "* ]] \
    || { echo "gpu_check.sh: unknown phase $name: choose among setup suite main training choose generate student" >&2; exit 2; }
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
export NAT_KD_TORCH=system PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" NAT_KD_DATA="$data" PYTHONUNBUFFERED=1
built="$(ls "$wheels"/fairseq_fixed-*.whl 2>/dev/null | head -n 1)"
[[ -n "$built" ]] && export NAT_KD_FAIRSEQ_WHEEL="$built"

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
teacher=runs/multi30k.en-de/teacher_tiny/checkpoint_best.pt
distilled=runs/multi30k.en-de/distill/beam5
prepared() { ls -d data/multi30k.en-de.* 2>/dev/null | head -n 1; }

# the GPU's use and memory every second, for each phase's share (the phases' clock times are in summary.txt)
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$out/gpu.csv" 2>&1 &
sampler=$!
trap 'kill "$sampler" 2>/dev/null' EXIT
note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1); cores: $(nproc)"

versions() {
  .venv/bin/python -c 'import torch, numpy, fairseq, sacrebleu, ctranslate2
print("versions: torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "fairseq",
      fairseq.__version__, "sacrebleu", sacrebleu.__version__, "ctranslate2", ctranslate2.__version__)' 2>&1 \
    | tail -n 1 | tee -a "$summary"
}

run_setup() {
  phase tests bash scripts/test.sh -m gpu
  grep -E "passed|failed|error" "$out/tests.log" | tail -n 3 | tee -a "$summary"
  versions
}

run_suite() {
  phase suite bash scripts/test.sh
  grep -E "passed|failed|error" "$out/suite.log" | tail -n 3 | tee -a "$summary"
}

run_main() {
  phase main_job bash scripts/main.sh
  grep -E "^== |BLEU = |done training" "$out/main_job.log" | head -n 20 >> "$summary"
  python -c 'import json, sys
timing = json.load(open(sys.argv[1]))["timing"]
print("main job distillation:", {k: timing.get(k) for k in ("wall_seconds", "decode_wall_seconds",
                                                            "sentences_per_second", "workers", "device")})' \
    "$distilled/meta.json" | tee -a "$summary"
  # CTranslate2 on this machine's CUDA: decodes, or says in one line what is missing
  phase ctranslate2 python -m nat_kd.generate_distilled --teacher-path "$teacher" --prepared "$(prepared)" \
    --split valid --backend ctranslate2 --device cuda --out /tmp/gpu_check.ct2.valid \
    --ct2-cache /tmp/gpu_check.ct2-cache
  tail -n 2 "$out/ctranslate2.log" >> "$summary"
}

run_training() {  # 6x512 with 16k-token batches: every family and the transformer, fp16 and fp32
  [[ -n "$(prepared)" ]] || phase prepare python -m nat_kd.prepare --src en --tgt de
  local deadline=$(( $(left) - 70 ))
  (( deadline > ${GPU_CHECK_TRAINING_SECONDS:-$deadline} )) && deadline=$GPU_CHECK_TRAINING_SECONDS
  (( deadline > 60 )) || { note "training: skipped, $(left) s left"; return; }
  phase training python scripts/benchmarks/bench_training.py --data "$(prepared)/bin" --out "$out/training" \
    --models nat glat ctc glat_ctc dat transformer --shapes 6x512:16384 --precisions fp16 fp32 \
    --warmup 30 --updates 100 --repeats 1 --deadline "$deadline"
  tail -n 16 "$out/training.log" >> "$summary"
}

run_choose() {  # pilots as a user runs them: fairseq-train on the GPU, its exit status, validation BLEU
  phase choose python -m nat_kd.choose --corpus "$(prepared)" --candidates "$distilled" --arch kd_glat_tiny \
    --shape 6x512 --updates 300 --final-updates 3000 --no-analysis --out /tmp/gpu_check.choose
  head -n 12 /tmp/gpu_check.choose/ranking.md >> "$summary" 2>&1
  grep -h -E "terminate called|Aborted|exit status" /tmp/gpu_check.choose/logs/*.log 2>/dev/null | head -n 5 >> "$summary"
}

run_generate() {  # the first 10,000 training sentences; each variant against the same fairseq-generate run
  local spec variants=()
  IFS=';' read -r -a specs <<< "${GPU_CHECK_VARIANTS:-auto=--max-tokens auto;fp16auto=--fp16 --max-tokens auto;w2=--workers 2;w4=--workers 4;fp16=--fp16;big=--max-tokens 32000;fp16w4=--fp16 --workers 4}"
  for spec in "${specs[@]}"; do variants+=(--variant "$spec"); done
  phase generate python scripts/benchmarks/bench_generate.py --teacher-path "$teacher" --prepared "$(prepared)" \
    --split train --limit 10000 --beam 5 --max-tokens 12000 --repeats 1 --skip-default-count --device cuda \
    --workers 1 "${variants[@]}"
  grep -E "identical|sent/s|speed vs" "$out/generate.log" >> "$summary"
}

run_student() {  # a NAT student's fairseq-train (next_steps' task, criterion, optimizer): exit 0 on the GPU?
  phase student fairseq-train "$distilled/bin" --user-dir fairseq_plugins --task translation_lev \
    --criterion nat_loss --noise full_mask --pred-length-offset --length-loss-factor 0.1 --arch kd_nat_tiny \
    --label-smoothing 0.1 --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.001 --lr-scheduler inverse_sqrt \
    --warmup-updates 200 --warmup-init-lr 1e-07 --max-tokens 4096 --required-batch-size-multiple 1 \
    --max-update 300 --save-dir /tmp/gpu_check.student --no-epoch-checkpoints --seed 1 --log-format simple \
    --log-interval 50 --no-progress-bar
  grep -h -E "done training|terminate called|Aborted" "$out/student.log" | head -n 3 >> "$summary"
}

if [[ " ${phases[*]} " != *" setup "* ]]; then
  bash scripts/bootstrap.sh
  versions
fi
for name in "${phases[@]}"; do
  if (( $(left) < 30 )); then
    note "$name: not started, $(left) s of the budget left"
    continue
  fi
  [[ "$name" == setup ]] || source .venv/bin/activate
  "run_$name"
done
note "done; $(left) s of the budget left"
