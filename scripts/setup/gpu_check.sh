#!/usr/bin/env bash
# The GPU check, on a machine whose Python already holds a CUDA torch (docs/installation.md, "On a GPU"),
# offline: each phase timed, within a budget, its output in OUT/PHASE.log and its times in OUT/summary.txt.
#   bash scripts/setup/gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]
# WHEELS: the wheels the machine lacks, a built fairseq-fixed among them (docs/installation.md says which);
# DATA: the raw Multi30k folder; OUT: summary.txt, gpu.csv, stores.tar (the studies' new store files, to unpack at
# the checkout's root and commit), logs.tar.gz (every phase's log, the studies' logs and records) and the benchmarks'
# results.json files.
# PHASES, run in the order given (default: setup teachers training generate main):
#   setup     the set-up from WHEELS and the GPU's own tests (-m gpu; without this phase, the set-up alone)
#   teachers  the teachers the open studies still need and their beam sets (TEACHER_PLANS below), every study at once,
#             each with --device cuda --jobs N --store docs/results/NAME; their store files into OUT/stores.tar
#   suite     the whole suite, the README's test command as it is (on the CPU but for the GPU's own tests)
#   main      the main job (bash scripts/main.sh), and CTranslate2 on this CUDA
#   training  scripts/benchmarks/bench_training.py: the DA-Transformer and CTC with glancing (no GPU figure yet) and
#             fairseq's transformer, 6x512 with 16k-token batches, fp32 and --fp16, until the budget's end
#   choose    python -m nat_kd.choose: GLAT pilots on the GPU, which train, exit and are scored as a user's
#   generate  scripts/benchmarks/bench_generate.py: the generator against fairseq-generate, with batches sized to the
#             GPU's free memory (--max-tokens auto) against the 32000 default, --fp16 and more workers sharing the GPU
#   student   a vanilla NAT student's fairseq-train on the distilled set, 300 updates: its exit status
# Environment: GPU_CHECK_TEACHER_SECONDS and GPU_CHECK_TRAINING_SECONDS cap those phases (to leave time for the
# phases after them); GPU_CHECK_VARIANTS replaces the generate phase's variants (NAME=ARGS;NAME=ARGS...);
# GPU_CHECK_DRY_RUN=1 runs the same phases on the CPU (micro studies into scratch stores, micro models,
# a few updates), so that no GPU minute is spent on a typo (docs/results/gpu/README.md, "The prepared call").
# generate uses the main job's teacher and distilled set from this call or an earlier one in the same checkout, else
# the first teacher the teachers phase trained; choose and student need the main job's. A phase starts only while
# the budget lasts, and teachers and training stop at theirs.
#
# The budget of one lent GPU (15 minutes of device time, start-up included; a call runs 10 minutes at most and the
# machine goes back 30 s after it), from what was measured (docs/results/gpu/README.md):
#   the machine's start and the working tree's transfer   outside this script: "a minute or more"
#   setup from the wheel folder, without the GPU's tests  106 s with them on an H100, of which pytest 57 s: ~50 s
#   teachers                                              what is left of the first call (a 3x256 teacher trained
#                                                         600 updates in 25.5 s on an H200; the 6x512 base has no
#                                                         GPU figure at the ladder's 4096-token batches)
#   training (6 configurations)                           ~37.5 s each (the transformer's whole run): ~225 s
#   generate (fairseq-generate, auto, 32000)              58.8 s + 2 x ~30 s: ~120 s
#   main                                                  204 s on an H200
# So one lent GPU runs two calls, the second at once on the warm machine:
#   bash scripts/setup/gpu_check.sh .gpu-wheels .gpu-data/multi30k OUT 570 teachers                  # timeout_s 590
#   GPU_CHECK_TRAINING_SECONDS=150 bash scripts/setup/gpu_check.sh .gpu-wheels .gpu-data/multi30k OUT 200 training
# and the generate and main phases wait for the next one.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
wheels="$(cd "${1:?usage: gpu_check.sh WHEELS DATA OUT [BUDGET_SECONDS [PHASE...]]}" && pwd)"
data="$(cd "${2:?}" && pwd)"
out="${3:?}"
budget="${4:-540}"
phases=("${@:5}")
(( ${#phases[@]} )) || phases=(setup teachers training generate main)
for name in "${phases[@]}"; do
  [[ " setup teachers suite main training choose generate student " == *" $name "* ]] \
    || { echo "gpu_check.sh: unknown phase $name: choose among setup teachers suite main training choose generate student" >&2; exit 2; }
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
export PYTHONUNBUFFERED=1

# The teachers the open studies still need, the most needed first: PROFILE STORE STEP..., the steps their beam sets
# (each trains its teacher first; what the store holds with the same inputs is restored, not trained): the ladder's
# base rung (two cores cannot train it in three hours), its medium rung, kd-methods' three teachers. Beside them the
# ladder's DA-Transformer students, five hours each on one core (its upsampled graph over the vocabulary): the one
# on the real data at once, those on the two sets once their sets are made.
TEACHER_PLANS=("ladder docs/results/ladder distil.base.beam distil.medium.beam student.dat.real student.dat.medium.beam student.dat.base.beam"
               "kd-methods docs/results/kd_methods distil.converged.beam distil.converged-s2.beam distil.converged-s3.beam")
GENERATE_TEACHER="kd_methods teacher.converged"  # with no main job here: a 3x256 teacher, the main job's shape
device=cuda
raw_dir="$data"  # where it lies does not change the prepared corpus's digest (its manifest names no path)
stores="$root"  # the stores' paths are relative to it, and so are they in stores.tar
studies=runs/gpu_check  # the teachers phase's study folders
train_sizes=(--shapes 6x512:16384 --precisions fp16 fp32 --warmup 30 --updates 100)
generate_sizes=(--limit 10000 --max-tokens 12000)
variants="auto=--max-tokens auto;big=--max-tokens 32000;fp16auto=--fp16 --max-tokens auto;w4=--workers 4"
if [[ -n "${GPU_CHECK_DRY_RUN:-}" ]]; then  # the same phases on the CPU, micro-sized
  TEACHER_PLANS=("ladder-micro ladder distil.tiny.beam distil.small.beam"
                 "kd-effect-micro kd_effect distil.converged.beam distil.weak.beam")
  GENERATE_TEACHER="kd_effect teacher.converged"
  device=cpu stores="$out/stores" studies="$out/studies"
  train_sizes=(--cpu --shapes 1x16:512 --precisions fp32 --warmup 1 --updates 2)
  generate_sizes=(--limit 40 --max-tokens 2048 --max-len-b 10)
  variants="big=--max-tokens 4096"
  mkdir -p "$stores"
else
  export NAT_KD_TORCH=system PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels"
  built="$(ls "$wheels"/fairseq_fixed-*.whl 2>/dev/null | head -n 1)"
  [[ -n "$built" ]] && export NAT_KD_FAIRSEQ_WHEEL="$built"
fi
export NAT_KD_DATA="$raw_dir"

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
scratch="$(mktemp -d)"
record() {  # record STUDY STEP KEY: a value of a finished step's result, or nothing
  python - "$studies/$1/steps/$2.json" "$3" <<'EOF' 2>/dev/null
import json, sys
print(json.load(open(sys.argv[1]))["result"][sys.argv[2]])
EOF
}

# the GPU's use and memory every second, for each phase's share (the phases' clock times are in summary.txt)
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$out/gpu.csv" 2>&1 &
sampler=$!
trap 'kill "$sampler" 2>/dev/null; rm -rf "$scratch"' EXIT
note "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1); cores: $(nproc)"

versions() {
  .venv/bin/python -c 'import torch, numpy, fairseq, sacrebleu, sentencepiece, ctranslate2
print("versions: torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "fairseq",
      fairseq.__version__, "sacrebleu", sacrebleu.__version__, "sentencepiece", sentencepiece.__version__,
      "ctranslate2", ctranslate2.__version__)' 2>&1 | tail -n 1 | tee -a "$summary"
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

run_teachers() {  # every study of TEACHER_PLANS at once, its steps --jobs at a time on the one GPU
  local cap=$(( $(left) - 15 ))  # 15 s to pack what came of it
  (( cap > ${GPU_CHECK_TEACHER_SECONDS:-$cap} )) && cap=$GPU_CHECK_TEACHER_SECONDS
  local end=$((SECONDS + cap))
  until_end() { local s=$((end - SECONDS)); echo $(( s > 1 ? s : 1 )); }  # timeout 0 would mean none
  local plan profile store steps name ready=() jobs=0 pids=() names=() started="$scratch/started"
  touch "$started"
  # 1. each study's corpus first: its digest must be the one committed beside the same fingerprint in any store, or
  #    the teachers' records, whose fingerprints chain through it, would not restore a study on the CPU (another
  #    sentencepiece's pieces; where the corpus is read from is not in the manifest); such a study is left out
  mkdir -p "$scratch/committed"
  local pinned have
  pinned="$(sed -n 's/^sentencepiece==//p' scripts/constraints.txt)"
  have="$(python -c 'import sentencepiece; print(sentencepiece.__version__)')"
  [[ "$have" == "$pinned" ]] || note "teachers: sentencepiece $have here, $pinned in scripts/constraints.txt: its pieces may \
differ, which the corpus's digest (its manifest's) does not see; a restore on the CPU refuses a set whose bin/ differs"
  for plan in "${TEACHER_PLANS[@]}"; do
    read -r profile store steps <<< "$plan"
    [[ -f "$stores/$store/steps/prepare.json" ]] \
      && cp "$stores/$store/steps/prepare.json" "$scratch/committed/$(basename "$store").json"
  done
  for plan in "${TEACHER_PLANS[@]}"; do  # the corpora at once
    read -r profile store steps <<< "$plan"
    name="$(basename "$store")"
    phase "prepare.$name" timeout -k 10 "$(until_end)" python -m nat_kd.study "$profile" --device "$device" \
      --out "$studies/$name" --store "$stores/$store" --only prepare &
    pids+=($!)
  done
  wait "${pids[@]}"
  pids=()
  for plan in "${TEACHER_PLANS[@]}"; do
    read -r profile store steps <<< "$plan"
    name="$(basename "$store")"
    [[ -f "$studies/$name/steps/prepare.json" ]] || continue
    if ! python - "$studies/$name/steps/prepare.json" "$scratch/committed" <<'EOF'
import json, pathlib, sys
made = json.load(open(sys.argv[1]))
same = [json.load(open(p)) for p in pathlib.Path(sys.argv[2]).glob("*.json")]
sys.exit(any(c["fingerprint"] == made["fingerprint"] and c["digest"] != made["digest"] for c in same))
EOF
    then
      if [[ -f "$scratch/committed/$name.json" ]]; then cp "$scratch/committed/$name.json" "$stores/$store/steps/prepare.json"
      else rm -f "$stores/$store/steps/prepare.json"; fi
      note "teachers: $profile left out: its corpus's digest here ($(record "$name" prepare dir)/manifest.json) is not the committed one: other files in $raw_dir, or another sentencepiece"
      continue
    fi
    ready+=("$plan")
    jobs=$((jobs + $(wc -w <<< "$steps")))
  done
  (( jobs )) || return
  # 2. the studies at once; a study's steps share the cores (torch's threads feed the GPU)
  local threads=$(( $(nproc) / jobs ))
  (( threads )) || threads=1
  for plan in "${ready[@]}"; do
    read -r profile store steps <<< "$plan"
    name="$(basename "$store")"
    local only=()
    for step in $steps; do only+=(--only "$step"); done
    phase "teachers.$name" timeout -k 10 "$(until_end)" python -m nat_kd.study "$profile" --device "$device" \
      --jobs "$(wc -w <<< "$steps")" --threads "$threads" --out "$studies/$name" --store "$stores/$store" "${only[@]}" &
    pids+=($!) names+=("$name")
  done
  wait "${pids[@]}"
  # 3. what each store gained (a step's record is written there as it ends: a study cut short keeps its finished
  #    steps), to commit at once; the studies' logs and records beside the phases' logs
  local store_paths=()
  for plan in "${TEACHER_PLANS[@]}"; do read -r profile store steps <<< "$plan"; store_paths+=("$store"); done
  (cd "$stores" && find "${store_paths[@]}" -type f -newer "$started" 2>/dev/null | sort > "$scratch/stored")
  tar -cf "$out/stores.tar" -C "$stores" -T "$scratch/stored"
  note "teachers: $(wc -l < "$scratch/stored") store files in stores.tar: $(tr '\n' ' ' < "$scratch/stored")"
  for name in "${names[@]}"; do
    grep -h -E "^ran |^not started|failed|error" "$out/teachers.$name.log" | tail -n 3 >> "$summary"
  done
}

run_main() {
  phase main_job bash scripts/main.sh
  grep -E "^== |BLEU = |done training" "$out/main_job.log" | head -n 20 >> "$summary"
  python -c 'import json, sys
timing = json.load(open(sys.argv[1]))["timing"]
print("main job distillation:", {k: timing.get(k) for k in ("wall_seconds", "decode_wall_seconds",
                                                            "sentences_per_second", "workers", "device")})' \
    "$distilled/meta.json" | tee -a "$summary"
  # CTranslate2 on this machine's CUDA: decodes, or says in one line what is missing (the cuda12-cublas extra's
  # wheel, 581 MB, cannot be carried)
  phase ctranslate2 python -m nat_kd.generate_distilled --teacher-path "$teacher" --prepared "$(prepared)" \
    --split valid --backend ctranslate2 --device "$device" --out /tmp/gpu_check.ct2.valid \
    --ct2-cache /tmp/gpu_check.ct2-cache
  tail -n 2 "$out/ctranslate2.log" >> "$summary"
}

run_training() {  # every family not yet measured in both precisions, and the transformer, fp16 and fp32
  local data="$(prepared)"
  [[ -n "$data" ]] || data="$(record "${GENERATE_TEACHER%% *}" prepare dir)"  # the teachers phase's, if it ran here
  [[ -n "$data" ]] || { phase prepare python -m nat_kd.prepare --src en --tgt de; data="$(prepared)"; }
  local deadline=$(( $(left) - 70 ))
  (( deadline > ${GPU_CHECK_TRAINING_SECONDS:-$deadline} )) && deadline=$GPU_CHECK_TRAINING_SECONDS
  (( deadline > 60 )) || { note "training: skipped, $(left) s left"; return; }
  phase training python scripts/benchmarks/bench_training.py --data "$data/bin" --out "$out/training" \
    --models dat glat_ctc transformer "${train_sizes[@]}" --repeats 1 --deadline "$deadline"
  tail -n 16 "$out/training.log" >> "$summary"
}

run_choose() {  # pilots as a user runs them: fairseq-train on the GPU, its exit status, validation BLEU
  phase choose python -m nat_kd.choose --corpus "$(prepared)" --candidates "$distilled" --arch kd_glat_tiny \
    --shape 6x512 --updates 300 --final-updates 3000 --no-analysis --out /tmp/gpu_check.choose
  head -n 12 /tmp/gpu_check.choose/ranking.md >> "$summary" 2>&1
  grep -h -E "terminate called|Aborted|exit status" /tmp/gpu_check.choose/logs/*.log 2>/dev/null | head -n 5 >> "$summary"
}

run_generate() {  # the first 10,000 training sentences; each variant against the same fairseq-generate run
  local spec variants_=() with="$teacher" corpus study step
  corpus="$(prepared)"
  if [[ ! -f "$with" ]]; then  # no main job here: the teachers phase's teacher of the main job's shape
    read -r study step <<< "$GENERATE_TEACHER"
    with="$(record "$study" "$step" checkpoint)" corpus="$(record "$study" prepare dir)"
  fi
  [[ -f "$with" && -n "$corpus" ]] || { note "generate: skipped, no teacher's checkpoint here (run main, or teachers where it trains one)"; return; }
  note "generate: the teacher $with on $corpus"
  IFS=';' read -r -a specs <<< "${GPU_CHECK_VARIANTS:-$variants}"
  for spec in "${specs[@]}"; do variants_+=(--variant "$spec"); done
  phase generate python scripts/benchmarks/bench_generate.py --teacher-path "$with" --prepared "$corpus" \
    --split train "${generate_sizes[@]}" --beam 5 --repeats 1 --skip-default-count --device "$device" \
    --workers 1 "${variants_[@]}"
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

if [[ -n "${GPU_CHECK_DRY_RUN:-}" ]]; then
  note "dry run on the CPU: the venv as it is, micro studies into $stores"
elif [[ " ${phases[*]} " != *" setup "* ]]; then
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
# the logs in one file (a call brings back a few files only), the studies' logs and records with them
beside=()
[[ -d "$studies" ]] && beside=(-C "$(cd "$studies" && pwd)" $(cd "$studies" && ls -d */logs */steps 2>/dev/null))
(cd "$out" && tar -czf logs.tar.gz *.log "${beside[@]}") && rm -f "$out"/*.log
