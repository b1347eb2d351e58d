#!/usr/bin/env bash
# The main job on the default corpus (Multi30k en-de), from nothing:
#   1. set up .venv (once)               2. prepare the data (cached by content hash)
#   3. train the tiny AT teacher briefly  4. decode the validation set with it (BLEU)
#   5. distil the training set with it (beam 5)
#   6. analyse real vs distilled data: complexity, faithfulness, reordering, BLEU; table and figure
#   7. print the next step: fairseq-train for a NAT student on the distilled set, and its twin on the real data
# Re-running skips what is done: the data is cached, training resumes from its last checkpoint (and stops at
# once when its update budget is reached), distillation resumes from its saved chunks.
# Settings via environment: SRC, TGT, TEACHER_UPDATES, RUN_DIR, NAT_KD_DATA (raw corpus folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/bootstrap.sh
source .venv/bin/activate

SRC="${SRC:-en}" TGT="${TGT:-de}"
TEACHER_UPDATES="${TEACHER_UPDATES:-600}"
RUN_DIR="${RUN_DIR:-runs/multi30k.$SRC-$TGT}"
TEACHER="$RUN_DIR/teacher_tiny"

echo "== 1/5 prepare Multi30k $SRC-$TGT"
DATA="$(python -m nat_kd.prepare --src "$SRC" --tgt "$TGT" | tail -n 1)"
BIN="$DATA/bin"
mkdir -p "$RUN_DIR"

echo "== 2/5 train the tiny AT teacher ($TEACHER_UPDATES updates; log: $TEACHER.log)"
# fairseq-train resumes from checkpoint_last.pt, but takes one more step even when the budget is reached:
# a marker written after a finished run makes a re-run a true no-op.
if [[ "$(cat "$TEACHER/finished_updates" 2>/dev/null)" == "$TEACHER_UPDATES" ]]; then
  echo "already trained for $TEACHER_UPDATES updates"
else
# --required-batch-size-multiple 1: fairseq's default (8) silently drops the longest sentences.
fairseq-train "$BIN" --user-dir fairseq_plugins --task translation --arch kd_transformer_tiny \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 1e-3 \
  --lr-scheduler inverse_sqrt --warmup-updates 200 --weight-decay 0.0001 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 4096 --required-batch-size-multiple 1 --max-update "$TEACHER_UPDATES" \
  --save-dir "$TEACHER" --no-epoch-checkpoints --seed 1 \
  --log-format simple --log-interval 50 --no-progress-bar 2>&1 | tee -a "$TEACHER.log" \
  | grep --line-buffered -E "valid on|done training|Loaded checkpoint"
echo "$TEACHER_UPDATES" > "$TEACHER/finished_updates"
fi

echo "== 3/5 decode the validation set with the teacher (beam 5)"
fairseq-generate "$BIN" --user-dir fairseq_plugins --task translation --gen-subset valid \
  --path "$TEACHER/checkpoint_best.pt" --beam 5 --max-tokens 8192 \
  --required-batch-size-multiple 1 --remove-bpe sentencepiece --scoring sacrebleu \
  > "$TEACHER/valid.generate.txt" 2> "$TEACHER/valid.generate.log"
tail -n 1 "$TEACHER/valid.generate.txt"
# fairseq-generate's closing line: "Generate valid with beam=5: BLEU = 29.80 ..."; the card records it
VALID_BLEU="$(sed -n 's/.*: BLEU = \([0-9.]*\).*/\1/p' "$TEACHER/valid.generate.txt" | tail -n 1)"

echo "== 4/5 distil the training set with the teacher (beam 5)"
python -m nat_kd.generate_distilled --teacher-path "$TEACHER/checkpoint_best.pt" --prepared "$DATA" \
  --split train --strategy beam --beam 5 --out "$RUN_DIR/distill/beam5"

python -m nat_kd.analyze card "$RUN_DIR/distill/beam5" --teacher-valid-bleu "$VALID_BLEU"

echo "== 5/5 analyse the real and the distilled training data"
python -m nat_kd.analyze report --real-src "$DATA/raw/train.$SRC" --real-tgt "$DATA/raw/train.$TGT" \
  --set-dir "$RUN_DIR/distill/beam5" --drop-empty --out "$RUN_DIR/analysis"

echo "== next: train a vanilla NAT student on the distilled set, and its twin on the real data"
python -m nat_kd.next_steps --prepared "$DATA" --distilled "$RUN_DIR/distill/beam5" --out "$RUN_DIR/students"
