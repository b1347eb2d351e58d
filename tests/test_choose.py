"""nat_kd.choose: pilots on two candidate sets and the real data, ranked, resumed; bad input refused up front;
and the pilot agreement it reports (nat_kd.study.pilots) against hand-made curves."""
import json
import re
import shutil

import pytest

from nat_kd.choose import main
from conftest import ROOT
from nat_kd.study import pilots

TRAIN = 203  # tiny_en_de's training pairs


def write_candidate(prepared, out, make_target):
    """A distilled set of the training split written by the generator's own output code, its targets made by
    hand from the references."""
    import sentencepiece
    from fairseq.data import Dictionary

    from nat_kd.distill.output import write_output
    from nat_kd.distill.source import load_binarized

    refs = (prepared / "raw" / "train.de").read_text(encoding="utf-8").splitlines()
    sources = (prepared / "raw" / "train.en").read_text(encoding="utf-8").splitlines()
    assert len(refs) == len(sources) == TRAIN
    targets = [make_target(i, r) for i, r in enumerate(refs)]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(prepared / "spm.model"))
    tokens = load_binarized(prepared / "bin", "train", "en", "en-de", Dictionary.load(str(prepared / "bin" / "dict.en.txt")))
    meta = {"name": out.name, "strategy": "beam", "split": "train", "source_lang": "en", "target_lang": "de",
            "sentences": TRAIN, "empty_source_lines": [], "truncated_source_lines": [], "teacher": {},
            "files": {"source": "train.en", "target": "train.de", "binarized_left_out_lines": []}}
    write_output(out, split="train", src="en", tgt="de", source_text=sources, source_tokens=tokens,
                 source_pieces=[" ".join(p) for p in sp.encode(sources, out_type=str)],
                 target_pieces=[" ".join(p) for p in sp.encode(targets, out_type=str)], target_text=targets,
                 dict_dir=prepared / "bin", data_dir=prepared / "bin", meta=meta)
    return out


@pytest.fixture(scope="module")
def corpus(tiny_en_de, tmp_path_factory):
    """tiny_en_de's 203 training pairs with 100 validation and test pairs (each pilot decodes the validation
    set), prepared as a user's own corpus with tiny_en_de's sentencepiece model."""
    from nat_kd.prepare import PrepareConfig, prepare

    raw = tmp_path_factory.mktemp("raw")
    for split, count in (("train", TRAIN), ("valid", 100), ("test", 100)):
        for lang in ("en", "de"):
            lines = (tiny_en_de / "raw" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            (raw / f"{split}.{lang}").write_text("".join(lines[:count]), encoding="utf-8")
    return prepare(PrepareConfig("en", "de", trainpref=str(raw / "train"), validpref=str(raw / "valid"),
                                 testpref=str(raw / "test"), spm_model=str(tiny_en_de / "spm.model")),
                   out_dir=tmp_path_factory.mktemp("data") / "en-de")


@pytest.fixture(scope="module")
def candidates(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("candidates")
    short = write_candidate(corpus, root / "short", lambda i, r: " ".join(r.split()[:4]))
    doubled = write_candidate(corpus, root / "doubled", lambda i, r: f"{r} {r}" if i % 2 else r)
    return short, doubled


@pytest.mark.slow
def test_choose_ranks_pilots_on_every_candidate_and_the_real_data_and_resumes(corpus, candidates, tmp_path, capsys):
    out = tmp_path / "choose"
    argv = ["--corpus", str(corpus), "--candidates", *map(str, candidates), "--arch", "kd_nat_tiny",
            "--updates", "3", "--final-updates", "6", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rank = json.loads((out / "ranking.json").read_text())
    assert sorted(r["set"] for r in rank["rows"]) == ["doubled", "real", "short"]
    scores = [r["valid_bleu"] for r in rank["rows"]]
    assert scores == sorted(scores, reverse=True)
    for name in ("real", "short", "doubled"):
        pilot = json.loads((out / "steps" / f"pilot.{name}.json").read_text())
        assert pilot["result"]["updates_trained"] == 3 and [p["updates"] for p in pilot["result"]["curve"]] == [3]
        assert pilot["result"]["valid_bleu"] == next(r["valid_bleu"] for r in rank["rows"] if r["set"] == name)
        assert "test_bleu" not in pilot["result"]  # a pilot never decodes the test set
        assert pilot["settings"]["data"] == (None if name == "real" else f"set.{name}")
    by_set = {r["set"]: r for r in rank["rows"]}
    # the analysis against the real data: the real set is itself, the short targets are shorter
    assert by_set["real"]["bleu"] == pytest.approx(100) and by_set["real"]["length_ratio"] == pytest.approx(1)
    assert by_set["short"]["length_ratio"] < 0.6 < 1.2 < by_set["doubled"]["length_ratio"]
    # vanilla NAT's pilots were measured at 250 updates and more: 3 is shorter than any
    assert rank["agreement"] == [] and rank["measured_updates"][0] == 250
    assert "Not measured this short" in printed and (out / "ranking.md").read_text() == printed
    assert printed.count("| short |") == 1 and "| 1 |" in printed

    records = {f.name: f.read_text() for f in (out / "steps").iterdir()}
    assert main(argv) == 0  # everything done: nothing trains again, the same ranking
    assert capsys.readouterr().out == printed
    assert {f.name: f.read_text() for f in (out / "steps").iterdir()} == records
    # the library function under the command line: the same run, its ranking returned
    from nat_kd.choose import ChooseConfig, choose
    assert choose(ChooseConfig(corpus, tuple(candidates), "kd_nat_tiny", 3, out, final_updates=6)) == rank
    assert capsys.readouterr().out == "" and (out / "ranking.md").read_text() == printed
    assert {f.name: f.read_text() for f in (out / "steps").iterdir()} == records

    # a longer budget continues each pilot from its checkpoint at 3 updates, and ranks them at 6
    longer = argv[:argv.index("--updates") + 1] + ["6"] + argv[argv.index("--updates") + 2:]
    assert main(longer) == 0
    rank = json.loads((out / "ranking.json").read_text())
    for name in ("real", "short", "doubled"):
        before = json.loads(records[f"pilot.{name}.json"])["result"]["curve"]
        pilot = json.loads((out / "steps" / f"pilot.{name}.json").read_text())
        curve = pilot["result"]["curve"]
        assert [p["updates"] for p in curve] == [3, 6] and curve[0] == before[0] and pilot["runs"] == 2
        assert next(r["valid_bleu"] for r in rank["rows"] if r["set"] == name) == curve[1]["valid_bleu"]
        log = (out / "logs" / f"pilot.{name}.log").read_text()
        assert log.count("No existing checkpoint found") == 1  # trained from scratch once
        assert re.search(r"Loaded checkpoint \S+ \(epoch \d+ @ 3 updates\)", log)


@pytest.mark.parametrize("breakage, message", [
    ("source", "train.en:5: the source differs from"),
    ("lines", "fewer lines than"),
    ("one more line", "more lines than"),
    ("missing", "no such folder; give the --out folder of nat_kd.generate_distilled or nat_kd.mix"),
    ("vocabulary", "another vocabulary (its teacher's); make it in the student's with generate_distilled "
                   "--student-data"),
    ("meta", "no meta.json: not a finished"),
    # made from another preparation of the corpus: the same training data, other validation sentences
    ("valid split", "valid.en-de.de.bin is not"),
    ("no valid split", "valid.en-de.de.bin: no such file: the set's bin/ has no validation split"),
    # the mistakes of a user who gives the wrong folder
    ("interrupted", "no such folder: its nat_kd.generate_distilled was interrupted (%(bad)s.partial holds"),
    ("corpus", "--candidates %(corpus)s is a prepared corpus (nat_kd.prepare output), not a set: the real data of "
               "--corpus is always ranked, as 'real'"),
    ("parent", "--candidates %(bad)s holds the sets doubled, short and is none itself: give them one by one "
               "(--candidates %(bad)s/doubled %(bad)s/short)"),
    ("split", "a set of the valid split (%(bad)s/meta.json): a candidate re-decodes the corpus's training split"),
    ("twice", "--candidates %(bad)s: given twice; give each set once"),
    ("direction", "a set of de-en (%(bad)s/meta.json), the corpus is en-de"),
    # steps/pilot.NAME.json's temporary name while it is written would be 256 bytes: a traceback
    ("long name", "its name is 226 bytes long; it names the set's files in --out, which allow it 225"),
])
def test_choose_refuses_a_candidate_it_cannot_compare(corpus, candidates, tmp_path, capsys, breakage, message):
    bad = tmp_path / "bad"
    shutil.copytree(candidates[0], bad)
    if breakage == "source":
        lines = (bad / "train.en").read_text(encoding="utf-8").splitlines()
        lines[4] += " extra"
        (bad / "train.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif breakage == "lines":
        lines = (bad / "train.en").read_text(encoding="utf-8").splitlines()
        (bad / "train.en").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    elif breakage == "one more line":  # a stray empty last line
        with open(bad / "train.en", "a", encoding="utf-8") as handle:
            handle.write("\n")
    elif breakage == "missing":
        shutil.rmtree(bad)
    elif breakage in ("valid split", "no valid split"):
        for file in (bad / "bin").glob("valid.*"):
            if breakage == "valid split":
                shutil.copyfile(file.with_name(file.name.replace("valid.", "test.")), file)
            else:
                file.unlink()
    elif breakage == "vocabulary":
        with open(bad / "bin" / "dict.de.txt", "a", encoding="utf-8") as handle:
            handle.write("__de__ 1\n")
    elif breakage == "interrupted":  # generate_distilled's progress, beside the folder it has not made yet
        shutil.rmtree(bad)
        (tmp_path / "bad.partial").mkdir()
    elif breakage == "corpus":
        bad = corpus
    elif breakage == "parent":  # the folder holding the sets
        shutil.rmtree(bad)
        for candidate in candidates:
            shutil.copytree(candidate, bad / candidate.name)
    elif breakage == "split":  # generate_distilled --split valid
        for lang in ("en", "de"):
            (bad / f"train.{lang}").rename(bad / f"valid.{lang}")
        meta = json.loads((bad / "meta.json").read_text(encoding="utf-8"))
        (bad / "meta.json").write_text(json.dumps(meta | {"split": "valid"}), encoding="utf-8")
    elif breakage == "long name":
        bad = bad.rename(tmp_path / ("b" * 226))
    elif breakage == "direction":  # made from a de-en preparation of the same pairs: the same files, swapped
        meta = json.loads((bad / "meta.json").read_text(encoding="utf-8"))
        (bad / "meta.json").write_text(json.dumps(meta | {"source_lang": "de", "target_lang": "en"}), encoding="utf-8")
        for lang in ("en", "de"):
            (bad / f"train.{lang}").rename(bad / f"train.{lang}.old")
        for theirs, ours in (("en", "de"), ("de", "en")):
            (bad / f"train.{theirs}.old").rename(bad / f"train.{ours}")
    elif breakage == "twice":  # the second time with a slash
        bad = [bad, f"{bad}/"]
    else:
        (bad / "meta.json").unlink()
    code = main(["--corpus", str(corpus), "--candidates", str(candidates[1]), *map(str, bad if isinstance(bad, list)
                 else [bad]), "--arch", "kd_glat_tiny", "--updates", "3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    message %= {"bad": tmp_path / "bad", "corpus": corpus}
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("arch, message", [
    ("kd_transformer_tiny", "--arch kd_transformer_tiny is an autoregressive model, not a NAT student"),
    ("cmlm_transformer", "--arch cmlm_transformer is a fairseq NAT model, not one of nat-kd's students"),
    ("kd_gpt_tiny", "--arch kd_gpt_tiny: no such architecture"),
])
def test_choose_refuses_an_autoregressive_or_unknown_student(corpus, candidates, tmp_path, capsys, arch, message):
    code = main(["--corpus", str(corpus), "--candidates", str(candidates[0]), "--arch", arch, "--updates", "3",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "kd_glat_tiny" in err


def test_only_a_glancing_student_s_pilots_depend_on_the_final_run_s_length(corpus, candidates, tmp_path):
    """--final-updates sets the glancing schedule; vanilla NAT has none, so its pilots stay done."""
    from nat_kd.choose import ChooseConfig, plan_pilots

    def pilot_settings(arch, final):
        pilots = plan_pilots(ChooseConfig(corpus, (candidates[0],), arch, 3, tmp_path, final_updates=final))
        return [s.settings for s in pilots.steps if s.name.startswith("pilot.")]

    assert pilot_settings("kd_nat_tiny", 6) == pilot_settings("kd_nat_tiny", 9000)
    glat = pilot_settings("kd_glat_tiny", 6), pilot_settings("kd_glat_tiny", 9000)
    assert [s["training"]["glance_anneal_updates"] for s in glat[0] + glat[1]] == [4, 4, 6000, 6000]


def test_label_smoothing_reaches_the_pilots_settings_only_where_the_loss_takes_it(corpus, candidates, tmp_path,
                                                                                     capsys):
    """A CTC or DAG pilot trains with 0 whatever --label-smoothing's default says, so 0 is its setting (the
    default used to sit in its fingerprint: changing it retrained pilots for nothing); another value is refused."""
    from nat_kd.choose import ChooseConfig, plan_pilots

    def smoothing(arch, given=None):
        pilots = plan_pilots(ChooseConfig(corpus, (candidates[0],), arch, 3, tmp_path, label_smoothing=given))
        return {s.settings["training"]["label_smoothing"] for s in pilots.steps if s.name.startswith("pilot.")}

    assert smoothing("kd_nat_tiny") == {0.1} and smoothing("kd_glat_tiny", 0.2) == {0.2}
    assert smoothing("kd_dat_tiny") == smoothing("kd_glat_ctc_tiny", 0) == {0.0}
    code = main(["--corpus", str(corpus), "--candidates", str(candidates[0]), "--arch", "kd_dat_tiny", "--updates",
                 "3", "--label-smoothing", "0.1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == ("error: --label-smoothing 0.1: kd_dat_tiny's loss has no label smoothing; leave "
                                 "the option out (or give 0)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["nat_kd.choose.check_candidate", "nat_kd.engine.runner.Runner.run"])
def test_ctrl_c_stops_choose_with_a_line_not_a_traceback(where, corpus, candidates, tmp_path, monkeypatch, capsys):
    """While a candidate's files are compared with the corpus's, and while the pilots train."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    assert main(["--corpus", str(corpus), "--candidates", str(candidates[0]), "--arch", "kd_nat_tiny", "--updates",
                 "3", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "stopped; rerun the same command to go on"


STUDIES_SHAPE = {"dropout": 0.1, "embed_dim": 128, "ffn_dim": 512, "heads": 4, "layers": 2}


def _student(family, data, curve, test, shape=STUDIES_SHAPE):
    return {"kind": "train", "settings": {"nat_family": family, "data": data, "prepare": "prepare",
                                          "arch": f"kd_{family}_tiny", "shape": shape},
            "result": {"curve": [{"updates": u, "valid_bleu": v} for u, v in curve], "test_bleu": test,
                       "updates_trained": curve[-1][0]}}


def test_pilot_agreement_ranks_each_family_s_pilots_against_its_final_test_bleu(tmp_path):
    records = {f"distil.{x}": {"kind": "distil", "result": {"name": x}} for x in "abc"}
    # at 250 updates the pilots order the sets d, c, b, a; the final test BLEU a, b, c, d; at 500 they agree
    finals = {None: 20.0, "distil.a": 19.0, "distil.b": 18.0, "distil.c": 17.0}
    early = {None: 1.0, "distil.a": 2.0, "distil.b": 3.0, "distil.c": 4.0}
    for data in finals:
        name = "real" if data is None else data.split(".")[1]
        records[f"student.nat.{name}"] = _student("nat", data, [(250, early[data]), (500, finals[data] - 5)],
                                                  finals[data])
    records["student.nat.real.seed2"] = {**_student("nat", None, [(250, 99.0), (500, 99.0)], 99.0)}
    records["student.nat.real.seed2"]["settings"]["seed"] = 2  # left out: seed 1 ranks the sets
    records["student.glat.real"] = _student("glat", None, [(250, 1.0)], 5.0)  # one set: no ranking
    rows = pilots.agreement("toy", records, budgets=(250, 500, 1000))
    assert [(r["family"], r["shape"], r["updates"]) for r in rows] == [("nat", "2x128", 250), ("nat", "2x128", 500)]
    first, second = rows
    assert first["rho"] == -1 and first["p"] == pytest.approx(2 / 24)  # both perfect orders of 4! = 24
    assert (first["pick"], first["final_best"], first["regret"]) == ("c", "real", 3.0)
    assert second["rho"] == 1 and (second["pick"], second["regret"]) == ("real", 0.0)
    path = tmp_path / "agreement.json"
    path.write_text(json.dumps({"rows": rows}))
    assert pilots.for_family("nat", "2x128", 400, path) == ([first], [250, 500])
    assert pilots.for_family("nat", "2x128", 5000, path) == ([second], [250, 500])
    assert pilots.for_family("nat", "2x128", 100, path) == ([], [250, 500])
    assert pilots.for_family("nat", "3x256", 500, path) == ([], [])  # measured at 2x128 only
    assert pilots.for_family("dat", "2x128", 500, path) == ([], [])
    assert pilots.trusted_budget("nat", "2x128", path) == 500 and pilots.trusted_budget("nat", "3x256", path) is None
    # a student stopped early (after 250 updates) is no set a 500-update pilot could pick, nor its final best
    records["distil.d"] = {"kind": "distil", "result": {"name": "d"}}
    records["student.nat.d"] = _student("nat", "distil.d", [(250, 0.5)], 25.0)
    at_500 = pilots.agreement("toy", records, budgets=(500,))[0]
    assert (at_500["sets"], at_500["final_best"], at_500["regret"]) == (4, "real", 0.0)


def test_the_committed_pilot_agreement_is_what_its_committed_studies_give():
    """choose prints pilot_agreement.json: it must be the pilots command's output over the results it names,
    each one committed (not a study folder on some machine)."""
    from pathlib import Path

    committed = json.loads(pilots.AGREEMENT.read_text(encoding="utf-8"))
    root = Path(__file__).resolve().parents[1]
    assert committed["sources"] and all(not Path(s).is_absolute() for s in committed["sources"])
    rows = []
    for source in committed["sources"]:
        results = json.loads((root / source).read_text(encoding="utf-8"))
        rows += pilots.agreement(results["profile"], results["steps"])
    assert rows == committed["rows"]


def test_choose_on_slurm_dry_run_gives_the_pilots_a_gpu_and_the_rest_none(corpus, candidates, tmp_path, capsys):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[launcher]\npartition = "gpu"\ngpu_type = "a100"\n[resources.train]\nhours = 2\n')
    argv = ["--corpus", str(corpus), "--candidates", *map(str, candidates), "--arch", "kd_dat_tiny", "--updates", "500",
            "--out", str(tmp_path / "out"), "--launcher", "slurm", "--cluster", str(cluster), "--dry-run"]
    assert main(argv) == 0
    jobs = {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith(" "):
            name = line.split()[0]
            jobs[name] = [line]
        else:
            jobs[name].append(line.strip())
    assert set(jobs) == {"prepare", "set.short", "set.doubled", "analysis", "pilot.real", "pilot.short",
                         "pilot.doubled"}
    for name in ("prepare", "set.short", "set.doubled"):  # reading folders' records: the driver does it, no job
        assert jobs[name] == [f"{name}  [prepare: in the driver, no job]"]
    for name, lines in jobs.items():
        gpu = "#SBATCH --gpus-per-node=a100:1" in lines
        assert gpu == name.startswith("pilot."), (name, lines)
    assert "#SBATCH --time=120" in jobs["pilot.short"]
    assert not (tmp_path / "out").exists()  # nothing ran, nothing made

    cluster.write_text('[launcher]\nsbatch = {gres = "gpu:a100:1"}\n')
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gres = 'gpu:a100:1' would mix with the --gpus-per-node" in err and len(err.strip().splitlines()) == 1


def test_choose_started_elsewhere_hands_fairseq_the_folders_given(corpus, candidates, tmp_path, monkeypatch, capsys):
    """fairseq's jobs run in the checkout: relative --corpus and --candidates, given from another folder, must
    still name the user's folders there (they named the checkout's, or none: the pilot failed)."""
    import os

    from nat_kd.engine import fairseq_jobs

    given = []

    def train(bin_dir, save_dir, **_):
        given.append(fairseq_jobs.ROOT / bin_dir)  # a relative folder is read from the checkout
        raise RuntimeError("no training in this test")

    monkeypatch.setattr(fairseq_jobs, "train", train)
    monkeypatch.chdir(tmp_path)
    relative = [os.path.relpath(path, tmp_path) for path in (corpus, candidates[0])]
    assert main(["--corpus", relative[0], "--candidates", relative[1], "--arch", "kd_nat_tiny", "--updates", "3",
                 "--out", "out", "--no-analysis"]) == 2
    assert "no training in this test" in capsys.readouterr().err
    assert given == [corpus / "bin"]  # the first pilot, on the real data (then choose stops)
    set_record = json.loads((tmp_path / "out" / "steps" / "set.short.json").read_text())
    assert set_record["result"]["dir"] == str(candidates[0])


@pytest.mark.parametrize("other", ["study", "file"])
def test_choose_refuses_an_out_folder_holding_what_it_did_not_write(corpus, candidates, tmp_path, capsys, other):
    """A study's folder has steps prepare and analysis too: choose's would wipe its prepared corpus and replace
    its records. A file as --out was a traceback."""
    out = tmp_path / "out"
    if other == "study":
        for name, text in [("steps/prepare.json", '{"fingerprint": "the study\'s"}'),
                           ("steps/student.nat.real.json", "{}"), ("work/prepare/data/manifest.json", "{}"),
                           ("logs/prepare.log", "")]:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        message = f"--out {out} holds {out / 'steps' / 'student.nat.real.json'}, which choose does not write"
    else:
        out.write_text("notes\n")
        message = f"{out} is a file, not a folder"
    before = sorted((str(p), p.is_file() and p.read_text()) for p in [out, *out.rglob("*")])
    code = main(["--corpus", str(corpus), "--candidates", str(candidates[0]), "--arch", "kd_nat_tiny",
                 "--updates", "3", "--out", str(out), "--no-analysis"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert sorted((str(p), p.is_file() and p.read_text()) for p in [out, *out.rglob("*")]) == before


def test_choose_s_help_says_what_detach_does_on_slurm(capsys):
    """On Slurm --detach submits the chained jobs and exits (it does not wait and leave them on Ctrl-C)."""
    from nat_kd.choose import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("--detach slurm: submit every step that is not done at once, each job waiting in the queue for its "
            "dependencies' jobs, and exit; the same command without --detach then waits for what is left and "
            "writes the ranking.") in help_text


def test_pilots_with_equal_scores_share_their_rank():
    """Pilots too short to tell the sets apart (all 0.00) are no ranking: the real data came first as rank 1."""
    from nat_kd.choose import render

    def ranked(*scores):
        rank = {"family": "nat", "shape_label": "2x128", "updates": 3, "agreement": [], "measured_updates": [],
                "trusted_updates": None, "noise": None,
                "rows": [{"set": name, "valid_bleu": bleu} for name, bleu in scores]}
        lines = render(rank, "kd_nat_tiny").splitlines()
        return [line.split(" | ")[:4] for line in lines if line.startswith("| ") and not line.startswith("| rank")]

    assert ranked(("real", 0.0), ("beam", 0.0), ("mix", 0.0)) == [
        ["| 1", "real", "0.00", "best"], ["| 1", "beam", "0.00", "best"], ["| 1", "mix", "0.00", "best"]]
    assert ranked(("beam", 5.0), ("real", 2.5), ("mix", 2.5), ("short", 1.0)) == [
        ["| 1", "beam", "5.00", "best"], ["| 2", "real", "2.50", "-2.50"], ["| 2", "mix", "2.50", "-2.50"],
        ["| 4", "short", "1.00", "-4.00"]]


def test_choose_refuses_a_corpus_without_a_validation_split(corpus, candidates, tmp_path, capsys):
    """Prepared without --validpref: the real data's pilot failed after the analysis and its training."""
    shutil.copytree(corpus, tmp_path / "en-de")
    for file in [tmp_path / "en-de" / "raw" / "valid.de", *(tmp_path / "en-de" / "bin").glob("valid.*")]:
        file.unlink()
    code = main(["--corpus", str(tmp_path / "en-de"), "--candidates", str(candidates[0]), "--arch", "kd_nat_tiny",
                 "--updates", "3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"--corpus {tmp_path / 'en-de'} has no validation split ({tmp_path / 'en-de' / 'raw' / 'valid.de'}, "
            f"{tmp_path / 'en-de' / 'bin' / 'valid.en-de.de'}.bin): each pilot is measured on it") in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family, shape, updates, line", [
    # the committed studies: vanilla NAT's pilots picked the final best in `decoding` from 500 updates, and in
    # `capacity` at 1,000 only; GLAT's from 250; none was measured at 3x256 (kd_*_tiny's own size)
    ("nat", "2x128", 250, "Verdict: do not trust this ranking yet. nat pilots at 2x128 of 250 updates did not rank "
     "the sets as full training did (decoding: picked beam.mix-repeated, 0.45 test BLEU below the final best; "
     "capacity: picked converged.beam, 0.43 test BLEU below the final best); they first picked the final best at "
     "1,000 updates."),
    ("nat", "2x128", 1000, "Verdict: trusted as far as measured. nat pilots at 2x128 of 1,000 updates picked the "
     "final best set in decoding (8 sets), capacity (4 sets)."),
    ("glat", "2x128", 300, "Verdict: trusted as far as measured. glat pilots at 2x128 of 250 updates picked the "
     "final best set in capacity (4 sets)."),
    ("glat", "2x128", 100, "Verdict: untested this short. glat pilots at 2x128 were measured from 250 updates on; "
     "they first picked the final best at 250 updates."),
    ("nat", "3x256", 500, "Verdict: untested. No committed study measured how nat pilots at 3x256 rank training "
     "sets: treat this ranking as a pilot's, nothing more."),
])
def test_the_ranking_opens_with_a_verdict_from_the_committed_pilots_of_that_family_and_shape(family, shape, updates,
                                                                                             line):
    from nat_kd.choose import ranking, render

    records = {f"pilot.{name}": {"result": {"curve": [{"updates": updates, "valid_bleu": bleu}]}}
               for name, bleu in (("real", 10.0), ("beam", 12.0))}  # 2 BLEU apart: more than any seed noise
    rank = ranking(records, ["beam"], family, shape, updates)
    lines = render(rank, f"kd_{family}_tiny").splitlines()
    assert lines[0] == f"# Which training set for kd_{family}_tiny at {shape}? Pilots of {updates:,} updates"
    assert lines[2] == line


def test_choose_says_in_one_line_how_to_make_a_corpus_it_takes_from_a_binarized_one(corpus, candidates, tmp_path,
                                                                                    capsys):
    """A fairseq-binarized folder (WMT's data-bin) is no nat_kd.prepare folder: the line says how to make one."""
    code = main(["--corpus", str(corpus / "bin"), "--candidates", str(candidates[0]), "--arch", "kd_nat_tiny",
                 "--updates", "3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"--corpus {corpus / 'bin'}: no manifest.json; give a nat_kd.prepare output folder, or make one from the "
            "corpus's raw text in its own tokens: python -m nat_kd.prepare") in err
    assert "then distil with --student-data DIR" in err and not (tmp_path / "out").exists()


def test_seed_noise_pools_each_sets_variance_over_its_seeds():
    records = {"distil.a": {"kind": "distil", "result": {"name": "a"}}}
    for name, data, seed, bleu in (("real", None, 1, 10.0), ("real.seed2", None, 2, 12.0), ("real.seed3", None, 3, 14.0),
                                   ("a", "distil.a", 1, 5.0), ("a.seed2", "distil.a", 2, 6.0)):
        records[f"student.nat.{name}"] = _student("nat", data, [(250, bleu)], 20.0)
        records[f"student.nat.{name}"]["settings"]["seed"] = seed
    records["student.glat.real"] = _student("glat", None, [(250, 3.0)], 5.0)  # one seed: no noise
    # real: mean 12, squares 4 + 0 + 4 = 8 over 2 df; a: mean 5.5, squares 0.5 over 1 df; pooled sqrt(8.5 / 3)
    assert pilots.seed_noise("toy", records, budgets=(250, 500)) == [
        {"study": "toy", "family": "nat", "shape": "2x128", "updates": 250, "sets": 2, "df": 3,
         "sd": round((8.5 / 3) ** 0.5, 4)}]


def test_a_leader_within_the_pilots_seed_noise_is_a_draw():
    """Vanilla NAT at 2x128, 1,000 updates (where its committed pilots picked the final best in both studies):
    the committed studies' seeds move its pilots by sd 0.37, pooled over decoding's and capacity's sets with
    several seeds, more than the leader's 0.30."""
    from nat_kd.choose import ranking, render

    noise = [r for r in json.loads(pilots.AGREEMENT.read_text())["noise"]
             if r["family"] == "nat" and r["shape"] == "2x128" and r["updates"] == 1000]
    sd = (sum(r["sd"] ** 2 * r["df"] for r in noise) / sum(r["df"] for r in noise)) ** 0.5
    records = {f"pilot.{name}": {"result": {"curve": [{"updates": 1000, "valid_bleu": bleu}]}}
               for name, bleu in (("real", 14.0), ("beam", 14.3), ("mix", 12.0))}
    rank = ranking(records, ["beam", "mix"], "nat", "2x128", 1000)
    assert rank["noise"]["sd"] == pytest.approx(sd) and f"{sd:.2f}" == "0.37"
    assert render(rank, "kd_nat_tiny").splitlines()[2] == (
        "Verdict: a draw at the top. beam leads real by 0.30 BLEU, less than the seed alone moves nat pilots at 2x128 "
        "of 1,000 updates in the committed studies (sd 0.37 over 4 sets): train both in full, or pilot longer.")


@pytest.mark.parametrize("family, updates, longer", [
    # vanilla NAT's committed pilots first picked the final best in every study at 1,000 updates
    ("nat", 250, "at least 1,000 updates, where nat pilots at 2x128 first picked the final best in every committed "
                 "study"),
    # none measured: twice as long, then look again
    ("cmlm", 250, "at least 500 updates, then choose again"),
])
def test_pilots_that_have_not_learned_yet_are_told_to_run_longer_before_anything_else(family, updates, longer):
    """A new user's case: the main job's beam set and a mix of it, kd_nat_tiny, 250 updates. The pilots reached
    validation BLEU 1.69 (real), 1.06 (mix) and 0.80 (beam); full training ranks a beam set about 4 BLEU above
    the real data. The verdict is neither a draw nor "train both": the pilots have not learned yet."""
    from nat_kd.choose import ranking, render

    records = {f"pilot.{name}": {"result": {"curve": [{"updates": updates, "valid_bleu": bleu}]}}
               for name, bleu in (("real", 1.69), ("mixrep", 1.06), ("beam", 0.80))}
    rank = ranking(records, ["mixrep", "beam"], family, "2x128", updates)
    assert render(rank, f"kd_{family}_tiny").splitlines()[2] == (
        "Verdict: pilot longer: these pilots have not learned yet. The best reached validation BLEU 1.69, below 5, "
        "where every student of the committed studies still at least doubled it over the next 250 updates: their "
        f"order is how fast they got off the ground, not the sets'. Pilot {longer}.")


def test_the_learned_floor_is_where_the_committed_students_stop_doubling():
    """The floor's reason, from the committed curves: below it, every student at least doubled its validation
    BLEU over the next 250 updates; vanilla NAT's pilots there (250 updates) missed the final best set in both
    studies that measured them."""
    points = [p for study in ("decoding", "kd_effect", "students", "capacity")
              for p in pilots.take_off(json.loads((ROOT / "docs" / "results" / study / "results.json").read_text())
                                       ["steps"])]
    below = [ratio for bleu, ratio in points if bleu < pilots.LEARNED_BLEU]
    assert len(below) >= 30 and min(below) >= 2.0
    assert min(ratio for bleu, ratio in points if pilots.LEARNED_BLEU <= bleu < 2 * pilots.LEARNED_BLEU) < 2.0
    rows = [r for r in pilots.measured("nat", "2x128") if r["updates"] == 250]
    assert len(rows) == 2 and all(r["regret"] > 0 for r in rows)