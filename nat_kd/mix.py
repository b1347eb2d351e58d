"""Selective mixing: a training set that takes, line by line, the distilled target or the real one.

    python -m nat_kd.mix --distilled runs/distill/beam5 --prepared data/multi30k.en-de.spm8000 --repeated \\
        --out runs/distill/beam5.mix-repeated

A line takes the real target when any rule given says so: ``--bleu-below X`` / ``--chrf-below X`` (its
sentence score against the reference, from the set's scores.tsv), ``--repeated`` (a repeated n-gram),
``--logprob-below Y`` (the teacher's length-normalised log-probability), ``--judge CHECKPOINT
--distilled-share P`` (a NAT student decodes the sources, and only the best P of the lines by how close its
output comes to the distilled target and the distilled target to the real one keep it; not Selective KD, whose
evaluator decides each batch during training: nat_kd.selective_kd); and
``--target-complexity C`` replaces further lines, worst first by ``--worst-by`` (sentence BLEU by default),
until the mix's C(d) reaches C. The output is a distilled-set folder like the generator's (SPLIT.SRC, SPLIT.TGT, spm/, bin/
ready for fairseq-train, scores.tsv with a ``replaced`` column, meta.json with the rule and the counts, and
the dataset card), written atomically. The source side, its binarized ids (truncation included) and the
dictionaries are the distilled set's own; the real targets' pieces are those of the prepared corpus. A set
binarized in the student's tokens (generate_distilled --student-data) is mixed into one too: bin/ holds the
mixed texts re-encoded with the student's data the set records, spm/ the teacher's pieces.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from nat_kd import __version__, cli
from nat_kd.analysis.metrics.sentence import SentenceScorer, SentenceScores, sacrebleu_statistics
from nat_kd.artifacts import DistilledSet, PreparedCorpus
from nat_kd.corpus import CorpusError, read_lines
from nat_kd.errors import SettingsError
from nat_kd.hashing import sha256_file

logger = logging.getLogger("nat_kd.mix")
WORST_BY = ("bleu", "chrf", "logprob")


@dataclass
class MixRule:
    """Which lines take the real target. Threshold rules are OR-ed; ``target_complexity`` then adds the
    worst remaining lines (lowest ``worst_by`` first) until the mix's C(d) reaches it."""

    bleu_below: float | None = None
    chrf_below: float | None = None
    logprob_below: float | None = None
    repeated: bool = False
    target_complexity: float | None = None
    worst_by: str = "bleu"
    # a NAT student checkpoint judges each distilled target, and only the best ``distilled_share`` of the lines
    # keep it (JUDGE_SCORE)
    judge: str | None = None
    distilled_share: float | None = None

    def __str__(self) -> str:
        parts = [f"bleu<{self.bleu_below:g}" if self.bleu_below is not None else "",
                 f"chrf<{self.chrf_below:g}" if self.chrf_below is not None else "",
                 f"logprob<{self.logprob_below:g}" if self.logprob_below is not None else "",
                 "repeated" if self.repeated else "",
                 (f"outside the {self.distilled_share:.0%} best by the judge's score"
                  if self.judge and self.distilled_share is not None else "")]
        text = " or ".join(p for p in parts if p)
        if self.target_complexity is not None:
            text = ((f"({text}) then " if text else "")
                    + f"worst {self.worst_by} first until C(d)={self.target_complexity:g}")
        return text or "none"

    def validate(self) -> None:
        if (self.judge is None) != (self.distilled_share is None):
            raise SettingsError("--judge and --distilled-share go together: a NAT student checkpoint, and the "
                                "share of the lines (0 to 1) whose distilled targets it keeps")
        if str(self) == "none":
            raise SettingsError("no rule given: pass --bleu-below, --chrf-below, --logprob-below, --repeated, "
                                "--judge with --distilled-share, or --target-complexity")
        if self.worst_by not in WORST_BY:
            raise SettingsError(f"--worst-by must be one of {', '.join(WORST_BY)}, not {self.worst_by!r}")
        if self.distilled_share is not None and not 0 < self.distilled_share <= 1:
            raise SettingsError(f"--distilled-share {self.distilled_share:g}: a share of the lines, more than 0 and at "
                                "most 1")
        if self.judge is not None and self.target_complexity is not None:
            raise SettingsError("--judge and --target-complexity each decide how many lines take the real target: "
                                "give one of them")

    def threshold_masks(self, scores: SentenceScores) -> dict[str, np.ndarray]:
        """Per threshold rule given, the lines it replaces."""
        masks = {}
        for name, column, limit in (("bleu", "bleu", self.bleu_below), ("chrf", "chrf", self.chrf_below),
                                    ("logprob", "logprob", self.logprob_below)):
            if limit is not None:
                masks[name] = scores[column] < limit
        if self.repeated:
            masks["repeated"] = scores["repeated"] > 0
        return masks

    def order(self, scores: SentenceScores, chosen: np.ndarray) -> np.ndarray:
        """Every line, the threshold rules' first (in line order), then the others worst first (ties in line
        order)."""
        rest = np.flatnonzero(~chosen)
        rest = rest[np.argsort(scores[self.worst_by][rest], kind="stable")]
        return np.concatenate([np.flatnonzero(chosen), rest])


JUDGE_SCORE = ("(BLEU(the judge's output, distilled target) + BLEU(distilled target, real target)) / 2, "
                   "sentence BLEU")


def judge_scores(evaluated: list[str], distilled: list[str], quality: np.ndarray) -> np.ndarray:
    """Each line's judge score: how close the judge's output comes to the distilled target (how
    learnable the target is for a NAT) and how close the distilled target comes to the real one (``quality``:
    the set's sentence BLEU), averaged (JUDGE_SCORE)."""
    learnable = SentenceScorer().score(evaluated, distilled)["bleu"]
    return (learnable + quality) / 2


def keep_best(scores: np.ndarray, share: float) -> np.ndarray:
    """The lines whose distilled target stays: the ``share`` best by ``scores`` (rounded up; equal scores in line
    order), as a mask."""
    kept = np.zeros(len(scores), dtype=bool)
    kept[np.argsort(-scores, kind="stable")[:int(np.ceil(share * len(scores)))]] = True
    return kept


def judge_outputs(checkpoint: str, distilled: DistilledSet, meta: dict, prepared: PreparedCorpus,
                  work: Path) -> list[str]:
    """The judge's translations of the set's sources, one a line ('' for the lines left out of bin/),
    decoded as the study decodes its students (fairseq-generate, the family's flags) and detokenized as the
    corpus."""
    from fairseq_plugins.models.nat import STUDENT_ARCHS
    from fairseq_plugins.teacher import read_checkpoint
    from nat_kd.engine.fairseq_jobs import translate

    state = read_checkpoint(checkpoint, "--judge")
    arch = state["cfg"]["model"].arch if state.get("cfg") is not None else state["args"].arch
    if arch not in STUDENT_ARCHS:
        raise SettingsError(f"--judge {checkpoint} is a {arch} model; give a nat-kd NAT student's checkpoint "
                            "(kd_FAMILY_SIZE), e.g. a vanilla NAT trained on the real data")
    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    left_out = set(meta.get("files", {}).get("binarized_left_out_lines", []))
    # a source the judge cannot take (longer than its positions) gets no output: an empty line, which
    # scores 0 and so keeps the real target
    lines = translate(distilled.bin.root, Path(checkpoint), split, work / "judge.hyp", beam=1, max_tokens=8192,
                      log=work / "judge.log", threads=1, tokenization=prepared.tokenization(),
                      languages=(src, tgt), nat_family=STUDENT_ARCHS[arch][0],
                      sentences=meta["sentences"] - len(left_out))
    decoded = iter(lines)
    return ["" if line in left_out else next(decoded) for line in range(1, meta["sentences"] + 1)]


def mix_targets(distilled: list[str], real: list[str], replace: np.ndarray) -> list[str]:
    """Line i is real[i] where replace[i], else distilled[i]."""
    if not (len(distilled) == len(real) == len(replace)):
        raise CorpusError(f"cannot mix {len(distilled)} distilled lines with {len(real)} real ones "
                          f"({len(replace)} decisions); they must be line-aligned")
    return [r if swap else d for d, r, swap in zip(distilled, real, replace.tolist())]


def complexity_of(source: list[str], target: list[str], names: tuple[str, str]) -> float:
    """C(d) of a parallel text with the report's default settings (13a, lowercased, fast_align -d -o -v);
    ``names`` say where the two sides come from, for an error message."""
    from nat_kd.analysis.metrics import Complexity, align_corpus
    from nat_kd.analysis.tokenizers import get_tokenizer

    aligned = align_corpus(source, target, get_tokenizer("13a", lowercase=True), names=names, drop_empty=True,
                           links=False)
    return Complexity().table_score(aligned.result.exported_table()).score


def reach_complexity(source: list[str], distilled: list[str], real: list[str], order: np.ndarray, start: int,
                     target: float, files: tuple[str, str, str]) -> tuple[int, list[tuple[int, float]]]:
    """The fewest lines k >= start, taken from ``order``, whose replacement brings C(d) to ``target``
    (bisection: C(d) is taken to move monotonically from the distilled set's value towards the real data's);
    returns k and every (k, C(d)) measured. ``files``: where the source, distilled and real lines come from."""
    measured = {}

    def c_of(k: int) -> float:
        if k not in measured:
            replace = np.zeros(len(distilled), dtype=bool)
            replace[order[:k]] = True
            names = (files[0], f"{files[1]} with {k} of its lines from {files[2]}")
            measured[k] = complexity_of(source, mix_targets(distilled, real, replace), names)
            logger.info("C(d) with %d lines replaced: %.4f", k, measured[k])
        return measured[k]

    low, high = start, len(order)
    first, last = c_of(low), c_of(high)
    if not min(first, last) <= target <= max(first, last):
        raise SettingsError(f"--target-complexity {target:g} is not between the C(d) of the mix before the worst-"
                            f"first replacements ({first:.4f}) and of the real data ({last:.4f}): choose one in "
                            "that range")
    reached = (lambda c: c <= target) if first > last else (lambda c: c >= target)
    while low < high:
        middle = (low + high) // 2
        if reached(c_of(middle)):
            high = middle
        else:
            low = middle + 1
    return low, sorted(measured.items())


def real_pieces(prepared: PreparedCorpus | None, reference: str, spm_model: str | None, split: str,
                tgt: str, tokenization: dict | None = None) -> list[str]:
    """The real targets in the teacher's tokens: the prepared corpus's own spm/ file (what its bin/ was built
    from), else the references encoded with ``spm_model``, else with the set's recorded --bpe/--tokenizer."""
    from nat_kd.tokenization import Tokenization, TokenizationSettings

    if prepared is not None and prepared.pieces(split, tgt).is_file():
        return read_lines(prepared.pieces(split, tgt))
    if spm_model:
        settings = TokenizationSettings.sentencepiece(spm_model)
    elif tokenization and tokenization.get("detokenized"):
        settings = TokenizationSettings(tokenization.get("bpe"), tokenization.get("tokenizer"),
                                        tokenization.get("post_process"))
    else:
        raise SettingsError("pass --prepared (nat_kd.prepare output) or --spm-model: the real targets must be "
                            "written as the teacher's tokens, and the set records no --bpe/--tokenizer to do it")
    return Tokenization(settings, tgt).encode_all(read_lines(reference))


def _described(fingerprint: dict) -> str:
    """A tokenization's fingerprint (``TokenizationSettings.fingerprint``, or the generator's record of it) in
    a few words for an error message."""
    if "spm_model" in fingerprint:
        return f"sentencepiece model sha256 {fingerprint['spm_model'][:12]}"
    if "tokenization" not in fingerprint:
        return "nothing about its tokenization"
    recorded = fingerprint["tokenization"]
    names = [recorded[section]["_name"] for section in ("tokenizer", "bpe") if recorded.get(section)]
    files = [digest[:12] for digest in recorded.get("files_sha256", {}).values()]
    return (" + ".join(names) or "no tokenization") + (f" (files sha256 {', '.join(files)})" if files else "")


def check_same_tokens(prepared: PreparedCorpus, distilled: DistilledSet, meta: dict) -> None:
    """The prepared corpus's pieces may stand for the set's real targets only in the set's own tokens: its
    tokenization (settings and the bytes of its files) must be the one the generator recorded in meta.json's
    fingerprint. Any other would write pieces the set's dictionary lacks, as <unk>, into bin/."""
    ours = prepared.tokenization().fingerprint()
    recorded = meta.get("fingerprint", {})
    if {key: recorded.get(key) for key in ours} != ours:
        raise CorpusError(f"--prepared {prepared.root} is tokenized with {_described(ours)}, but "
                          f"{distilled.meta_file} records {_described(recorded)}: pass the prepared corpus the "
                          "teacher was trained on, or --reference with --spm-model set to the teacher's model")


def mix(distilled_dir: str | Path, out_dir: str | Path, rule: MixRule, *, prepared: str | None = None,
        reference: str | None = None, spm_model: str | None = None, name: str | None = None) -> dict:
    """Build the mixed set; returns its meta.json."""
    from nat_kd.distill.output import write_output
    from nat_kd.distill.pipeline import check_set_folder
    from nat_kd.distill.scores import scores as corpus_scores, statistics
    from nat_kd.distill.source import source_token_lines
    from nat_kd.distill.student_vocabulary import StudentData

    rule.validate()
    source_set, out = DistilledSet(distilled_dir), DistilledSet(out_dir)
    meta = source_set.meta()
    if meta is None:
        raise CorpusError(f"{source_set.root} has no meta.json: pass a set written by nat_kd.generate_distilled")
    if out.root.resolve() == source_set.root.resolve():
        raise SettingsError(f"--out {out.root} is the distilled set itself; choose another folder")
    check_set_folder(out)
    if not source_set.scores_file.is_file():
        raise CorpusError(f"{source_set.scores_file} does not exist: write it with python -m nat_kd.analyze card "
                          f"{source_set.root} (or regenerate the set)")
    split, src, tgt = meta["split"], meta["source_lang"], meta["target_lang"]
    prepared_corpus = PreparedCorpus(prepared) if prepared else None
    if prepared_corpus is not None:
        check_same_tokens(prepared_corpus, source_set, meta)
    # a set in the student's tokens: its bin/ holds the texts encoded with the student's data, not spm/'s pieces
    student = StudentData.recorded(meta, source_set.meta_file)
    reference = reference or (str(prepared_corpus.raw(split, tgt)) if prepared_corpus else None)
    if reference is None:
        raise SettingsError("pass --prepared or --reference: the real targets to mix in")
    source_text, distilled_text = read_lines(source_set.text(split, src)), read_lines(source_set.text(split, tgt))
    real_text = read_lines(reference)
    scores = SentenceScores.read(source_set.scores_file)
    if not (len(real_text) == len(distilled_text) == len(scores)):
        raise CorpusError(f"line-count mismatch: {source_set.text(split, tgt)} has {len(distilled_text)} lines, "
                          f"{reference} {len(real_text)} and {source_set.scores_file} {len(scores)}; they must be "
                          "line-aligned")

    masks = rule.threshold_masks(scores)
    judged = None
    if rule.judge is not None:
        if prepared_corpus is None:
            raise SettingsError("--judge needs --prepared: the judge's outputs are detokenized as the corpus")
        with tempfile.TemporaryDirectory(prefix=f"{out.root.name}.judge-", dir=out.root.parent) as work:
            evaluated = judge_outputs(rule.judge, source_set, meta, prepared_corpus, Path(work))
        combined = judge_scores(evaluated, distilled_text, scores["bleu"])
        masks["judge"] = ~keep_best(combined, rule.distilled_share)
        judged = {"judge": str(Path(rule.judge).resolve()), "judge_sha256": sha256_file(rule.judge),
                  "share": rule.distilled_share, "score": JUDGE_SCORE,
                  "kept": int((~masks["judge"]).sum()), "mean_score": round(float(combined.mean()), 4)}
    chosen = np.logical_or.reduce(list(masks.values())) if masks else np.zeros(len(scores), dtype=bool)
    search = None
    if rule.target_complexity is not None:
        order = rule.order(scores, chosen)
        k, search = reach_complexity(source_text, distilled_text, real_text, order, int(chosen.sum()),
                                     rule.target_complexity,
                                     (str(source_set.text(split, src)), str(source_set.text(split, tgt)), reference))
        chosen = np.zeros(len(scores), dtype=bool)
        chosen[order[:k]] = True
    target_text = mix_targets(distilled_text, real_text, chosen)
    target_pieces = mix_targets(read_lines(source_set.pieces(split, tgt)),
                                real_pieces(prepared_corpus, reference, spm_model, split, tgt,
                                            meta.get("tokenization")), chosen)

    # bin/ lacks the lines the generator left out (empty sources): they stay out, whichever target they take
    left_out = meta.get("files", {}).get("binarized_left_out_lines", [])
    source_tokens = source_token_lines(source_set, meta)
    per_line = sacrebleu_statistics(target_text, real_text)
    logprob = np.where(chosen, np.nan, scores["logprob"]) if "logprob" in scores.columns else None
    line_scores = SentenceScorer().score(target_text, real_text, per_line, logprob).with_column("replaced", chosen)
    counts = {"lines": len(chosen), "replaced": int(chosen.sum()),
              "replaced_by_rule": {k: int(v.sum()) for k, v in masks.items()}}
    new_meta = {
        **{k: meta[k] for k in ("settings", "all_settings", "seed", "backend", "teacher", "corpus", "split",
                                "source_lang", "target_lang", "sentences", "empty_source_lines",
                                "truncated_source_lines", "max_source_positions") if k in meta},
        "name": name or out.root.name, "strategy": f"{meta.get('strategy') or ''}+mix",
        "empty_outputs": sum(1 for p in target_pieces if not p),
        "scores": corpus_scores([statistics(target_text, real_text, per_line)], target_text, real_text),
        "mix": {"rule": str(rule), "settings": asdict(rule), **counts,
                "distilled": str(source_set.root.resolve()), "distilled_meta_sha256": sha256_file(source_set.meta_file),
                "reference": str(Path(reference).resolve()),
                "complexity_search": [[k, c] for k, c in search] if search else None,
                **({"judge": judged} if judged else {})},
        "nat_kd_version": __version__,
        "files": {"source": out.text(split, src).name, "target": out.text(split, tgt).name,
                  "binarized": f"{out.bin.root.name}/", "pieces": f"{out.pieces_dir.name}/",
                  "binarized_sentences": len(source_text) - len(left_out), "binarized_left_out_lines": left_out,
                  "scores": out.scores_file.name, "card": [out.card_markdown.name, out.card_json.name]},
    }
    bin_arguments = (student.bin_arguments(source_text, target_text, new_meta) if student else
                     {"dict_dir": source_set.bin.root, "data_dir": source_set.bin.root})
    write_output(out.root, split=split, src=src, tgt=tgt, source_text=source_text, source_tokens=source_tokens,
                 source_pieces=read_lines(source_set.pieces(split, src)), target_pieces=target_pieces,
                 target_text=target_text, meta=new_meta, bin_left_out=left_out, references=real_text,
                 sentence_scores=line_scores, **bin_arguments)
    if student:
        student.warn_unknown(new_meta)
    return new_meta


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nat_kd.mix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--distilled", required=True, help="the distilled set folder (meta.json, scores.tsv)")
    p.add_argument("--prepared", help="nat_kd.prepare output: its raw/SPLIT.TGT and spm/SPLIT.TGT are the real targets")
    p.add_argument("--reference", help="the real targets (raw text), if not --prepared")
    p.add_argument("--spm-model", help="sentencepiece model to encode --reference (not needed with --prepared)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--name", help="name recorded in meta.json (default: the output folder's name)")
    rules = p.add_argument_group("rules (a line takes the real target when any says so)")
    rules.add_argument("--bleu-below", type=float, metavar="X", help="sentence BLEU below X")
    rules.add_argument("--chrf-below", type=float, metavar="X", help="sentence chrF below X")
    rules.add_argument("--logprob-below", type=float, metavar="Y",
                       help="teacher's length-normalised log-probability below Y")
    rules.add_argument("--repeated", action="store_true", help="the output repeats an n-gram (scores.tsv's flag)")
    rules.add_argument("--target-complexity", type=float, metavar="C",
                       help="then replace the worst lines first until the mix's C(d) reaches C")
    rules.add_argument("--worst-by", choices=WORST_BY, default="bleu", help="what 'worst' means (default bleu)")
    rules.add_argument("--judge", metavar="CHECKPOINT",
                       help="a NAT student's checkpoint (kd_FAMILY_SIZE) decodes the sources, and only "
                            "the --distilled-share best lines by (BLEU(its output, distilled) + BLEU(distilled, real)) "
                            "/ 2 keep their distilled target (needs --prepared)")
    rules.add_argument("--distilled-share", type=float, metavar="P",
                       help="with --judge: the share of the lines (0 to 1) that keep their distilled target")
    cli.add_verbose_argument(p)
    return p


def main(argv=None) -> int:
    cli.setup_logging(argv)
    args = build_parser().parse_args(argv)

    def body():
        rule = MixRule(args.bleu_below, args.chrf_below, args.logprob_below, args.repeated, args.target_complexity,
                       args.worst_by, args.judge, args.distilled_share)
        meta = mix(args.distilled, args.out, rule, prepared=args.prepared, reference=args.reference,
                   spm_model=args.spm_model, name=args.name)
        m = meta["mix"]
        print(f"{args.out}: {m['replaced']} of {m['lines']} lines take the real target ({m['rule']}); "
              f"BLEU {meta['scores']['bleu']:.2f} vs reference")

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
