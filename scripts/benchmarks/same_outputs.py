"""Does this checkout write the same public outputs as an earlier commit, byte for byte?

    python scripts/benchmarks/same_outputs.py --base 9efd8ad [--lines 3000] [--keep /tmp/measures_baseline]

The base commit is exported (git archive) into a temporary folder. Both checkouts then run, each as
subprocesses of this environment's python started in its own folder (so each imports its own nat_kd), on the
same inputs at the same paths:

* ``python -m nat_kd.analyze report`` on the first ``--lines`` pairs of Multi30k en-de train as the real data,
  with distilled sets made by hand from its targets (some lines lowercased, words swapped or dropped, a few
  lines emptied) in the distilled-set layout: once plainly, once with ``--drop-empty`` and the mode mix
  (``--lang``); its stdout, report.md, report.json, the figures, and each set's refreshed CARD.md, card.json
  and scores.tsv;
* the detailed report (``DetailedAnalysisReport``, as the study's analysis step runs it);
* meta.json's scores of each set (``nat_kd.distill.scores``);
* each committed study's results (docs/results/NAME) rendered again from its results.json by ``write_results``;
* choose's ranking (``render(ranking(...))``, ranking.json) on pilot records made by hand beside the detailed
  report's rows.

It prints, for every file either side wrote, whether the two are identical.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from checkout import unpack  # scripts/benchmarks/checkout.py, beside this script

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ("capacity", "decoding", "students", "kd_effect", "study_cpu")
SETS = ("mixed", "drop", "gaps")  # "gaps" has empty targets: only the --drop-empty report takes it

# Run in each checkout with ``python -c`` (the checkout's folder first on sys.path), the work folder as argv[1]:
# the set's meta.json scores first (the reports' cards show them), the rest after the command-line reports.
SCORES = r"""
import json, sys
from pathlib import Path
import nat_kd
from nat_kd.distill.scores import scores, statistics
assert Path(nat_kd.__file__).resolve().is_relative_to(Path.cwd().resolve()), nat_kd.__file__
work = Path(sys.argv[1])
references = (work / "inputs" / "real.de").read_text(encoding="utf-8").splitlines()
for meta_file in sorted(work.glob("sets*/*/meta.json")):
    meta = json.loads(meta_file.read_text())
    hypotheses = (meta_file.parent / "train.de").read_text(encoding="utf-8").splitlines()
    parts = [statistics(hypotheses[i:i + 700], references[i:i + 700]) for i in range(0, len(hypotheses), 700)]
    meta["scores"] = scores(parts, hypotheses, references)
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
"""
RENDER = r"""
import json, sys
from pathlib import Path
from nat_kd import atomic
from nat_kd.analysis.report import DataSet, DetailedAnalysisReport
from nat_kd.analysis.tokenizers import get_tokenizer
from nat_kd.choose import ranking, render
from nat_kd.study import config as study_config
from nat_kd.study.results import write_results

work = Path(sys.argv[1])
inputs, out = work / "inputs", work / "out"
real = DataSet("real", inputs / "real.en", inputs / "real.de", "reference")
sets = [DataSet(name, work / "sets2" / name / "train.en", work / "sets2" / name / "train.de", "by hand")
        for name in ("mixed", "drop", "gaps")]
report = DetailedAnalysisReport(get_tokenizer("13a", lowercase=True), drop_empty=True, buckets=[1, 2, 5, 20, 100],
                                floors=[1e-9, 1e-6, 1e-3], interpolation=0.1, repeat_n=[2, 3]).run(real, sets)
report.write(out / "detailed")
for name in ("capacity", "decoding", "students", "kd_effect", "study_cpu"):
    results = json.loads(Path(f"docs/results/{name}/results.json").read_text())
    write_results(study_config.load(f"docs/results/{name}/config.toml"), results["steps"], out / "render" / name,
                  results["command"])
records = {"analysis": {"result": {"rows": report.rows}}}
for i, name in enumerate(["real", "mixed", "drop", "gaps"]):
    records[f"pilot.{name}"] = {"result": {"curve": [{"updates": 250, "valid_bleu": 3.0 + i},
                                                      {"updates": 500, "valid_bleu": 9.5 - i * 1.25}]}}
for family, updates in (("nat", 500), ("glat", 250)):
    rank = ranking(records, ["mixed", "drop", "gaps"], family, "2x128", updates)
    atomic.write_json(out / "choose" / f"{family}.ranking.json", rank)
    atomic.write_text(out / "choose" / f"{family}.ranking.md", render(rank, f"kd_{family}_tiny"))
"""


def swap(line: str) -> str:
    """The line with its second and third words swapped (a reordering)."""
    words = line.split()
    return " ".join(words[:1] + words[2:3] + words[1:2] + words[3:])


def make_inputs(inputs: Path, data: Path, lines: int) -> None:
    """The real data (the corpus's first ``lines`` pairs), French text for the mode mix, and the sets by hand
    (in sets1/ for the plain report, sets2/ for the --drop-empty one: each report refreshes its sets' cards)."""
    inputs.mkdir(parents=True)
    text = {}
    for lang in ("en", "de", "fr"):
        with gzip.open(data / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            text[lang] = [next(f).rstrip("\n") for _ in range(lines)]
        (inputs / f"real.{lang}").write_text("".join(t + "\n" for t in text[lang]), encoding="utf-8")
    made = {"mixed": [t.lower() if i % 3 == 0 else swap(t) if i % 3 == 1 else t for i, t in enumerate(text["de"])],
            "drop": [" ".join(w for k, w in enumerate(t.split()) if k % 4 != 3) if i % 2 else t
                     for i, t in enumerate(text["de"])]}
    made["gaps"] = ["" if i in (4, 16, 99) else t for i, t in enumerate(made["drop"])]
    for folder, names in (("sets1", ("mixed", "drop")), ("sets2", SETS)):
        for name in names:
            target = inputs.parent / folder / name
            target.mkdir(parents=True)
            (target / "train.en").write_text("".join(t + "\n" for t in text["en"]), encoding="utf-8")
            (target / "train.de").write_text("".join(t + "\n" for t in made[name]), encoding="utf-8")
            meta = {"name": name, "strategy": "by hand", "split": "train", "source_lang": "en",
                    "target_lang": "de", "sentences": lines, "empty_source_lines": [], "truncated_source_lines": [],
                    "teacher": {"name": "none: made by hand"}, "corpus": {"reference": str(inputs / "real.de")},
                    "files": {"source": "train.en", "target": "train.de"}}
            (target / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def run(checkout: Path, args: list[str], stdout: Path | None = None) -> None:
    proc = subprocess.run([sys.executable, *args], cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        sys.exit(f"failed in {checkout}: python {' '.join(args[:3])} ...\n{proc.stderr[-3000:]}")
    if stdout:
        stdout.write_text(proc.stdout, encoding="utf-8")


def produce(checkout: Path, work: Path, data: Path, lines: int) -> None:
    """Every output of one checkout, under ``work`` (the same path for both checkouts: the outputs name it)."""
    inputs, out = work / "inputs", work / "out"
    make_inputs(inputs, data, lines)
    out.mkdir()
    run(checkout, ["-c", SCORES, str(work)])
    real = ["--real-src", str(inputs / "real.en"), "--real-tgt", str(inputs / "real.de")]
    report = ["-m", "nat_kd.analyze", "report", *real]
    run(checkout, [*report, *(f"--set-dir={work / 'sets1' / s}" for s in ("mixed", "drop")), "--out",
                   str(out / "report")], out / "report.stdout")
    run(checkout, [*report, *(f"--set-dir={work / 'sets2' / s}" for s in SETS), "--drop-empty",
                   f"--lang=de={inputs / 'real.de'}", f"--lang=fr={inputs / 'real.fr'}", "--out",
                   str(out / "report-drop-empty")], out / "report-drop-empty.stdout")
    run(checkout, ["-c", RENDER, str(work)])


def compare(base: Path, new: Path) -> bool:
    files = sorted({p.relative_to(base) for p in base.rglob("*") if p.is_file()}
                   | {p.relative_to(new) for p in new.rglob("*") if p.is_file()})
    same = True
    for name in files:
        a, b = base / name, new / name
        verdict = ("identical" if a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()
                   else "only in base" if not b.is_file() else "only in new" if not a.is_file() else "DIFFERS")
        same &= verdict == "identical"
        print(f"{verdict:12} {name}")
    return same


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit to compare with")
    p.add_argument("--lines", type=int, default=3000, help="pairs of Multi30k train taken as the real data")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"),
                   help="the raw Multi30k folder (train.{en,de,fr}.gz)")
    p.add_argument("--keep", help="copy both checkouts' outputs here (base/ and new/)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        tmp = Path(tmp)
        base = unpack(args.base, tmp / "base")
        work = tmp / "work"
        for side, checkout in (("base", base), ("new", ROOT)):
            produce(checkout, work, Path(args.data), args.lines)
            work.rename(tmp / f"{side}-outputs")
        print(f"base {args.base} against this checkout:")
        same = compare(tmp / "base-outputs", tmp / "new-outputs")
        if args.keep:
            for side in ("base", "new"):
                shutil.copytree(tmp / f"{side}-outputs", Path(args.keep) / side, dirs_exist_ok=True)
    print("every output identical" if same else "some outputs differ")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
