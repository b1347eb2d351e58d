"""Print the word-KD experiment's table (markdown) from its run folder:

    python scripts/experiments/word_kd_table.py OUT COND...
"""
import re
import sys
from pathlib import Path

LABELS = {
    "teacher": ("real references", "the teacher itself (not retrained here)"),
    "real": ("real references", "label-smoothed CE"),
    "word": ("real references", "word-KD, online teacher"),
    "word_off": ("real references", "word-KD, offline top-k"),
    "seq": ("teacher-distilled (Seq-KD)", "label-smoothed CE"),
    "seq_word": ("teacher-distilled (Seq-KD)", "word-KD, online teacher"),
}


def read_run(folder: Path) -> dict:
    log = (folder / "train.log").read_text(errors="replace") if (folder / "train.log").exists() else ""
    done = re.search(r"done training in ([\d.]+) seconds", log)
    updates = re.findall(r"num_updates (\d+)", log)
    bleu_lines = (folder / "test.generate.txt").read_text().splitlines() if (folder / "test.generate.txt").exists() else []
    bleu = re.search(r"BLEU = ([\d.]+)", bleu_lines[-1]) if bleu_lines else None
    # CPU seconds of the training process (/usr/bin/time): far less sensitive than wall time to other jobs
    timing = (folder / "time.txt").read_text() if (folder / "time.txt").exists() else ""
    cpu = re.search(r"([\d.]+) user_s ([\d.]+) sys_s", timing)
    return {"seconds": float(done.group(1)) if done else None, "updates": int(updates[-1]) if updates else None,
            "bleu": float(bleu.group(1)) if bleu else None,
            "cpu": float(cpu.group(1)) + float(cpu.group(2)) if cpu else None}


def main(out: str, conditions) -> None:
    runs = {c: read_run(Path(out) / c) for c in conditions}
    base = runs.get("real", {}).get("cpu")
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print("| student | training targets | loss | updates | test BLEU | train wall (s) | updates/s (wall) "
          "| CPU s / update | CPU vs real |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, r in runs.items():
        data, loss = LABELS.get(c, (c, ""))
        ups = r["updates"] / r["seconds"] if r["seconds"] and r["updates"] else None
        cpu_per_update = r["cpu"] / r["updates"] if r["cpu"] and r["updates"] else None
        ratio = f"{r['cpu'] / base:.2f}x" if base and r["cpu"] else "-"
        print(f"| {c} | {data} | {loss} | {fmt(r['updates'], 'd')} | {fmt(r['bleu'], '.2f')} | "
              f"{fmt(r['seconds'], '.0f')} | {fmt(ups, '.3f')} | {fmt(cpu_per_update, '.2f')} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
