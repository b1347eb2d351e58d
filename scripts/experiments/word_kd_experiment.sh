#!/usr/bin/env bash
# Word-level KD vs sequence-level KD on Multi30k en-de, at CPU scale (docs/results/word_kd.md).
#
# One small AT student (2+2 layers, 128 dims) trained for the same number of updates on:
#   real        the real references, label-smoothed CE
#   word        real references + word-level KD from the teacher, online (teacher run every step)
#   word_off    the same from the teacher's precomputed top-k (offline mode; also the speed comparison)
#   seq         the teacher's translations of the training set (Kim & Rush's Seq-KD)
#   seq_word    the teacher's translations + word-level KD, online (Seq-KD + Word-KD)
# then test BLEU (sacrebleu on detokenized beam-5 output) and a table with training speed.
# Re-running skips what is done (distilled data, top-k, finished students, decodes).
# Settings via environment: TEACHER, UPDATES, MAX_TOKENS, KD_ALPHA, KD_T, TOPK, OUT, CONDITIONS, DECODE,
# DISTILL_STRATEGY (beam | greedy).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
source .venv/bin/activate

SRC=en TGT=de
TEACHER="${TEACHER:-runs/multi30k.$SRC-$TGT/teacher_tiny/checkpoint_best.pt}"
UPDATES="${UPDATES:-300}" MAX_TOKENS="${MAX_TOKENS:-2048}"
# one thread per process: on a small shared machine, two threads fighting others' jobs run far slower
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
KD_ALPHA="${KD_ALPHA:-0.5}" KD_T="${KD_T:-1}" TOPK="${TOPK:-8}"
OUT="${OUT:-runs/multi30k.$SRC-$TGT/word_kd}"
CONDITIONS="${CONDITIONS:-real word word_off seq seq_word}"
DECODE="${DECODE:-1}"  # 0: training only (the speed comparison)
mkdir -p "$OUT"

DATA="$(python -m nat_kd.prepare --src "$SRC" --tgt "$TGT" | tail -n 1)"
BIN="$DATA/bin"

need_teacher() { [ -f "$TEACHER" ] || { echo "teacher $TEACHER not found: run scripts/main.sh first" >&2; exit 2; }; }

# Seq-KD data: the teacher's translations of the training set (beam 5, or DISTILL_STRATEGY=greedy where
# beam 5 is too slow), binarized with its dictionaries.
DISTILL_STRATEGY="${DISTILL_STRATEGY:-beam}"
DISTILL="$OUT/distill_$DISTILL_STRATEGY"
need_distilled() {
  need_teacher
  if [ ! -f "$DISTILL/bin/train.$SRC-$TGT.$TGT.bin" ]; then
    echo "== distilling the training set ($DISTILL_STRATEGY)"
    /usr/bin/time -f "%e wall_s %U user_s %S sys_s" -o "$OUT/distill.time" nice python -m nat_kd.generate_distilled \
      --teacher-path "$TEACHER" --prepared "$DATA" --split train --strategy "$DISTILL_STRATEGY" --beam 5 --out "$DISTILL" \
      --no-progress-bar 2>&1 | grep -v -i warn | tail -n 5
  fi
  local lines
  lines="$(wc -l < "$DISTILL/train.$TGT")"
  [ "$lines" -eq "$(wc -l < "$DATA/raw/train.$TGT")" ] || { echo "distilled set has $lines lines" >&2; exit 1; }
}

# Offline mode: the teacher's top-k on the real training references, computed once.
need_topk() {
  need_teacher
  if [ ! -f "$OUT/topk$TOPK/meta.json" ]; then
    echo "== teacher top-$TOPK on the real training set"
    /usr/bin/time -f "%e wall_s %U user_s %S sys_s" -o "$OUT/topk$TOPK.time" nice python -m nat_kd.teacher_topk \
      "$BIN" --teacher-path "$TEACHER" --k "$TOPK" --splits train --out "$OUT/topk$TOPK" 2>&1 | grep -v -i warn | tail -n 2
  fi
}

student() {  # NAME DATA_BIN CRITERION_ARGS...
  local name="$1" bin="$2"; shift 2
  local dir="$OUT/$name"
  if [ ! -f "$dir/checkpoint_last.pt" ] || ! grep -q "done training" "$dir/train.log" 2>/dev/null; then
    echo "== train $name"
    mkdir -p "$dir"
    # --disable-validation: every student gets exactly $UPDATES updates and is scored at its last checkpoint
    /usr/bin/time -f "%e wall_s %U user_s %S sys_s" -o "$dir/time.txt" nice fairseq-train "$bin" --user-dir fairseq_plugins --task translation --arch kd_transformer_tiny \
      --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128 \
      --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 \
      --decoder-attention-heads 4 --optimizer adam --adam-betas '(0.9, 0.98)' --lr 2e-3 \
      --lr-scheduler inverse_sqrt --warmup-updates 100 --max-tokens "$MAX_TOKENS" --required-batch-size-multiple 1 \
      --max-update "$UPDATES" --save-dir "$dir" --no-epoch-checkpoints --disable-validation --seed 1 \
      --log-format simple --log-interval 50 --no-progress-bar "$@" 2>&1 | grep -v -i warn > "$dir/train.log"
  fi
  [ "$DECODE" = 1 ] || return 0
  if [ ! -f "$dir/test.generate.txt" ] || ! tail -n 1 "$dir/test.generate.txt" | grep -q BLEU; then
    echo "== decode test with $name"
    nice fairseq-generate "$BIN" --user-dir fairseq_plugins --task translation --gen-subset test \
      --path "$dir/checkpoint_last.pt" --beam 5 --max-tokens 8192 --required-batch-size-multiple 1 \
      --remove-bpe sentencepiece --scoring sacrebleu 2>&1 | grep -v -i warn > "$dir/test.generate.txt"
  fi
  tail -n 1 "$dir/test.generate.txt"
}

# the teacher's own test BLEU, for reference in the table
if [ "$DECODE" = 1 ] && [ -f "$TEACHER" ] && ! tail -n 1 "$OUT/teacher/test.generate.txt" 2>/dev/null | grep -q BLEU; then
  echo "== decode test with the teacher"
  mkdir -p "$OUT/teacher"
  python -c "import sys, torch, fairseq_plugins; s = torch.load(sys.argv[1], weights_only=True)
print('teacher', sys.argv[1], 'num_updates', s['optimizer_history'][-1]['num_updates'])" "$TEACHER" 2>/dev/null \
    | tail -n 1 > "$OUT/teacher/train.log"
  nice fairseq-generate "$BIN" --user-dir fairseq_plugins --task translation --gen-subset test \
    --path "$TEACHER" --beam 5 --max-tokens 8192 --required-batch-size-multiple 1 \
    --remove-bpe sentencepiece --scoring sacrebleu 2>&1 | grep -v -i warn > "$OUT/teacher/test.generate.txt"
fi

CE=(--criterion label_smoothed_cross_entropy --label-smoothing 0.1)
KD=(--criterion word_kd --label-smoothing 0.1 --kd-alpha "$KD_ALPHA" --kd-temperature "$KD_T")
for c in $CONDITIONS; do
  case "$c" in
    real) student real "$BIN" "${CE[@]}" ;;
    word) need_teacher; student word "$BIN" "${KD[@]}" --teacher-path "$TEACHER" ;;
    word_off) need_topk; student word_off "$BIN" "${KD[@]}" --teacher-topk-path "$OUT/topk$TOPK" ;;
    seq) need_distilled; student seq "$DISTILL/bin" "${CE[@]}" ;;
    seq_word) need_distilled; student seq_word "$DISTILL/bin" "${KD[@]}" --teacher-path "$TEACHER" ;;
    *) echo "unknown condition $c" >&2; exit 2 ;;
  esac
done

python scripts/experiments/word_kd_table.py "$OUT" teacher $CONDITIONS | tee "$OUT/table.md"
