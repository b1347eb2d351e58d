"""The decoding profile in miniature, end to end (test_study_profiles.py runs the others): the central table, the
seed spread, the correlations and the speed table."""
import pytest
from conftest import run_profile


@pytest.mark.slow
def test_decoding_micro_profile_fills_the_central_table_and_resumes(tmp_path, capsys):
    """The decoding profile's tables in miniature: the central table (data measures, student BLEU, gap with the
    seed spread, bootstrap p, the paper's figures), the seed spread, the correlations and the speed table."""
    from nat_kd.study.__main__ import main

    out, corpus, results, text, steps, cfg = run_profile("decoding-micro", tmp_path, evaluation=40)
    labels = cfg.data_labels()
    assert len(labels) == 8 and labels[-2:] == ["beam.mix-repeated", "beam.mix-bleu10"]
    central = text.split("## The central table", 1)[1].split("###", 1)[0]
    for label in labels:
        row = next(line for line in central.splitlines() if line.startswith(f"| {label} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert "-" not in cells[2:11], row  # every data measure and both student BLEUs
        test_bleu = steps[f"student.nat.{label}"]["result"]["test_bleu"]
        assert cells[10] == f"{test_bleu:.2f}"
        if label == "converged.beam":
            assert cells[11:13] == ["-", "baseline"]
        else:
            assert "(seed sd" in cells[11] and 0 < float(cells[12]) <= 1, row
    beam_row = next(line for line in central.splitlines() if line.startswith("| converged.beam |"))
    assert beam_row.rstrip(" |").endswith("| 1.902 | 2.948 | 19.5")  # the paper's beam row beside ours
    # the mixes really are nat_kd.mix sets of the beam set, with their counts
    mix = steps["mix.beam.mix-repeated"]["result"]
    assert mix["lines"] == steps["distil.converged.beam"]["result"]["sentences"] and mix["rule"] == "repeated"
    decoding = text.split("## 2. Distilled", 1)[1].split("###", 1)[0]
    assert f"| beam.mix-repeated | converged | mix of converged.beam ({mix['replaced']:,} lines replaced) |" in decoding
    seeds = [steps[s]["result"]["test_bleu"] for s in ("student.nat.converged.beam", "student.nat.converged.beam.seed2")]
    spread = text.split("### Seed-to-seed spread", 1)[1].split("###", 1)[0]
    assert f"| converged.beam | 2 | {seeds[0]:.2f}, {seeds[1]:.2f} |" in spread
    assert steps["student.nat.converged.beam.seed2"]["settings"]["seed"] == 2
    assert "seed" not in steps["student.nat.converged.beam"]["settings"]  # seed 1 keeps old fingerprints
    correlations = text.split("### Do the data measures predict the student?", 1)[1].split("##", 1)[0]
    assert "over 8 training sets" in correlations
    for measure in ["C(d), paper (mean over types)", "C(d), token-weighted", "F(d), floor 1e-9", "FRS"]:
        assert f"| {measure} |" in correlations
    assert (results / "student_bleu_vs_complexity.png").stat().st_size > 10_000
    assert "a vertical line spans the test BLEU of every seed" in correlations  # beam's two seeds
    best = correlations.split("|---|---|---|\n", 1)[1].split(" |", 1)[0].lstrip("| ")
    drawn_anyway = {"C(d), paper (mean over types)", "C(d), token-weighted"}  # the figure's first two panels
    assert (f"(Right: against {best}, the best predictor" in correlations) == (best not in drawn_anyway)
    gains = text.split("## Does distillation help each student?", 1)[1].split("##", 1)[0]
    assert all(f"| nat | {label} |" in gains for label in labels)
    methods = text.split("## Does each KD method beat plain KD?", 1)[1].split("##", 1)[0]
    for mix in ("beam.mix-repeated", "beam.mix-bleu10"):  # each mix against the beam set it was made from
        row = next(line for line in methods.splitlines() if line.startswith(f"| nat | {mix} | converged.beam |"))
        assert f"| {seeds[0]:.2f}, {seeds[1]:.2f} |" in row and "| - |" not in row, row
    speed = text.split("## Speed against quality", 1)[1].split("##", 1)[0]
    systems = ["teacher converged beam", "teacher converged greedy", "nat on converged.beam", "cmlm on converged.beam"]
    for system in systems:
        for batching in ["batch size 1", "max tokens 2048"]:
            row = next(line for line in speed.splitlines() if line.startswith(f"| {system} | {batching} |"))
            assert "| - |" not in row, row
    runs = steps["speed"]["result"]["runs"]
    assert len(runs) == 4 * 2 and all(r["sentences"] == 40 for r in runs)
    assert "students_vs_teacher_capacity.png" not in text  # one teacher: no trend to draw
    assert "(copied from `nat_kd/study/profiles/decoding-micro.toml`)" in text  # not the machine's absolute path
    capsys.readouterr()
    assert main(["decoding-micro", "--out", str(out), "--data-dir", corpus, "--list"]) == 0
    assert capsys.readouterr().out.split().count("done") == len(steps)
    assert main(["decoding-micro", "--out", str(out), "--data-dir", corpus]) == 0
    assert f"ran 0 step(s), {len(steps)} already done" in capsys.readouterr().out
