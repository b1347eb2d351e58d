#!/usr/bin/env bash
# A small corpus and teacher of the kind a WMT user brings, built without nat_kd: Multi30k en-fr slices,
# Moses-tokenized (sacremoses, as tokenizer.perl -a), joint subword-nmt BPE, binarized by fairseq-preprocess
# with a joined dictionary (the steps of fairseq's examples/translation/prepare-wmt14en2de.sh), and a micro
# fairseq transformer teacher (plain --arch transformer, no plugin) trained on it in seconds.
# The tests build it (tests/test_own_corpus.py) and so can anyone reproducing docs/own_corpus.md:
#
#   bash scripts/experiments/make_foreign_corpus.sh OUT [TRAIN_LINES] [BPE_MERGES] [TEACHER_UPDATES]
#
# OUT/raw/SPLIT.{en,fr}   the untokenized text (SPLIT: train, valid, test)
# OUT/tok/, OUT/bpe/      Moses tokens; BPE units with "@@ " joiners
# OUT/code                the BPE codes
# OUT/data-bin/           fairseq-preprocess output
# OUT/teacher/checkpoint_last.pt
set -euo pipefail

OUT=${1:?usage: make_foreign_corpus.sh OUT [TRAIN_LINES] [BPE_MERGES] [TEACHER_UPDATES]}
TRAIN_LINES=${2:-500}
MERGES=${3:-300}
UPDATES=${4:-80}
EVAL_LINES=100
HERE=$(cd "$(dirname "$0")/../.." && pwd)
RAW=${NAT_KD_DATA:-$HERE/../shared/data/multi30k}

mkdir -p "$OUT"/raw "$OUT"/tok "$OUT"/bpe
for l in en fr; do
  zcat "$RAW/train.$l.gz" | sed -n "1,${TRAIN_LINES}p" > "$OUT/raw/train.$l"
  zcat "$RAW/val.$l.gz" | sed -n "1,${EVAL_LINES}p" > "$OUT/raw/valid.$l"
  zcat "$RAW/test_2016_flickr.$l.gz" | sed -n "1,${EVAL_LINES}p" > "$OUT/raw/test.$l"
  for split in train valid test; do
    sacremoses -q -l "$l" -j 1 tokenize -a < "$OUT/raw/$split.$l" > "$OUT/tok/$split.$l"
  done
done
cat "$OUT/tok/train.en" "$OUT/tok/train.fr" | subword-nmt learn-bpe -s "$MERGES" > "$OUT/code"
for l in en fr; do
  for split in train valid test; do
    subword-nmt apply-bpe -c "$OUT/code" < "$OUT/tok/$split.$l" > "$OUT/bpe/$split.$l"
  done
done
rm -rf "$OUT/data-bin"
fairseq-preprocess --source-lang en --target-lang fr --trainpref "$OUT/bpe/train" --validpref "$OUT/bpe/valid" \
  --testpref "$OUT/bpe/test" --destdir "$OUT/data-bin" --joined-dictionary --workers 1 > "$OUT/preprocess.log" 2>&1

# The teacher records its BPE and tokenizer (--bpe, --tokenizer), as fairseq's released WMT models do.
OMP_NUM_THREADS=1 fairseq-train "$OUT/data-bin" --arch transformer --share-all-embeddings \
  --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 \
  --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2 \
  --optimizer adam --lr 5e-3 --max-tokens 2048 --max-update "$UPDATES" --criterion label_smoothed_cross_entropy \
  --label-smoothing 0.1 --bpe subword_nmt --bpe-codes "$OUT/code" --tokenizer moses --source-lang en --target-lang fr \
  --required-batch-size-multiple 1 --save-dir "$OUT/teacher" --no-epoch-checkpoints --save-interval 1000 \
  --disable-validation --seed 1 --log-format none > "$OUT/teacher.log" 2>&1
echo "$OUT"
