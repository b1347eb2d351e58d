"""Which distilled pairs hurt, on a real set: its card, the frequency-bucket table, the share of repeated
outputs, and a mix that replaces the repeated outputs with the references, with C(d) of the real data, the
pure distilled set and the mix measured in one report (same tokeniser and aligner settings).

    python scripts/experiments/diagnose_distilled.py --distilled runs/.../distil.weak.beam/data \\
        --prepared runs/.../prepare/data --work runs/diagnose [--teacher-valid-bleu B]

The distilled set is copied into WORK first (its card and scores.tsv are refreshed there, and the original
folder is left alone); everything printed is also in WORK/report/report.md and the cards.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from nat_kd.analysis.card import refresh_card
from nat_kd.analysis.metrics.sentence import SentenceScorer, SentenceScores
from nat_kd.analysis.report import AnalysisReport, DataSet, set_from_dir
from nat_kd.analysis.tokenizers import get_tokenizer
from nat_kd.artifacts import DistilledSet, PreparedCorpus
from nat_kd.mix import MixRule, mix


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--distilled", required=True)
    p.add_argument("--prepared", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--teacher-valid-bleu", type=float)
    args = p.parse_args(argv)

    work = Path(args.work)
    pure = DistilledSet(work / "distilled")
    if not pure.meta_file.is_file():
        shutil.copytree(args.distilled, pure.root)
    meta = pure.meta()
    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    prepared = PreparedCorpus(args.prepared)
    started = time.perf_counter()
    if not pure.scores_file.is_file():  # a set written before scores.tsv existed: its texts give all but logprob
        print(f"{pure.scores_file} missing: computing it from the texts (no teacher log-probabilities)")
    refresh_card(pure.root, reference=prepared.raw(split, tgt), teacher_valid_bleu=args.teacher_valid_bleu)
    scores = SentenceScores.read(pure.scores_file)
    repeated = int(scores["repeated"].sum())
    ref_repeated = int((SentenceScorer().score(
        prepared.raw(split, tgt).read_text(encoding="utf-8").splitlines(), None)["repeated"]).sum())
    share, ref_share = 100 * repeated / len(scores), 100 * ref_repeated / len(scores)
    print(f"repeated outputs (a bigram twice, 13a lowercased): {repeated} of {len(scores)} ({share:.2f}%); "
          f"references: {ref_repeated} ({ref_share:.2f}%)")

    mixed = DistilledSet(work / "mix.repeated")
    mix_meta = mix(pure.root, mixed.root, MixRule(repeated=True), prepared=str(prepared.root), name="mix.repeated")
    print(f"mix: {mix_meta['mix']['replaced']} of {mix_meta['mix']['lines']} lines take the reference; "
          f"BLEU vs reference {mix_meta['scores']['bleu']:.2f} (pure: {meta['scores']['bleu']:.2f})")

    real = DataSet("real", prepared.raw(split, src), prepared.raw(split, tgt), "reference")
    sets = [set_from_dir(d.root, split, src, tgt) for d in (pure, mixed)]
    report = AnalysisReport(get_tokenizer("13a", lowercase=True), drop_empty=True).run(real, sets)
    report.write(work / "report")
    report.refresh_cards(real, sets)
    sys.stdout.write(report.to_markdown())
    rows = {row["name"]: row for row in report.rows}
    print(json.dumps({name: {k: rows[name][k] for k in ("complexity", "faithfulness", "reordering", "bleu")}
                      for name in rows}, indent=1))
    print(f"wall {time.perf_counter() - started:.1f} s; cards: {pure.card_markdown}, {mixed.card_markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
