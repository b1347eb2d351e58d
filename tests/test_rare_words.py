"""scripts/experiments/rare_words.py: the share of sentences with a rare source word whose target keeps a rare
word."""
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rare_words_counts_by_hand(tmp_path, capsys):
    main = runpy.run_path(str(ROOT / "scripts" / "experiments" / "rare_words.py"))["main"]
    (tmp_path / "src").write_text("A cat.\na dog\na cat runs\nthe zebra\n")  # seen once: dog, runs, the, zebra
    (tmp_path / "real").write_text("eine Katze\nein Hund\neine Katze rennt\ndas Zebra\n")
    (tmp_path / "beam").write_text("ein Tier\nein Tier\nein Tier rennt\nein Tier\n")
    assert main(["--source", str(tmp_path / "src"), "--target", f"real={tmp_path / 'real'}",
                 "--target", f"beam={tmp_path / 'beam'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 of 4 sentences hold one of the 4 source words seen once"
    # real: hund, rennt, das and zebra are each seen once; beam keeps only "rennt" (line 3)
    assert out[1] == "real: 1.000 of them have a target word seen once in real's targets"
    assert out[2] == "beam: 0.333 of them have a target word seen once in beam's targets"
    (tmp_path / "short").write_text("ein Tier\n")
    assert main(["--source", str(tmp_path / "src"), "--target", f"x={tmp_path / 'short'}"]) == 2
