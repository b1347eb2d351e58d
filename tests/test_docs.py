"""The front door stays short and its links lead somewhere: every relative link in README.md and docs/ names a
file or folder of the checkout."""
import re
from urllib.parse import unquote

from conftest import ROOT

README_MAX_LINES = 150
# [text](target) or [text](target "title"); the text may hold one level of brackets, as in [`a[0]`](b)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
EXTERNAL = ("http://", "https://", "mailto:")


def documents():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links outside code, less external ones and anchors within the page."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [target for target in LINK.findall(prose)
            if not target.startswith(EXTERNAL) and not target.startswith("#")]


def broken_links(document) -> list[str]:
    """The link targets of ``document`` whose file or folder does not exist (an anchor is not checked, the file
    it is in is)."""
    return [target for target in relative_links(document.read_text(encoding="utf-8"))
            if not (document.parent / unquote(target.split("#", 1)[0])).exists()]


def test_every_relative_link_points_somewhere():
    links = [link for document in documents() for link in relative_links(document.read_text(encoding="utf-8"))]
    assert len(links) > 20, "the link pattern finds the documents' links"
    broken = [f"{document.relative_to(ROOT)}: {target}" for document in documents()
              for target in broken_links(document)]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x", encoding="utf-8")
    page.write_text("[ok](there.md#part) [gone](nowhere.md#part) [`code[0]`](gone/) [web](https://x.org/a.md)\n"
                    "`[not a link](nowhere)`\n```\n[in a block](nowhere)\n```\n", encoding="utf-8")
    assert relative_links(page.read_text(encoding="utf-8")) == ["there.md#part", "nowhere.md#part", "gone/"]
    assert broken_links(page) == ["nowhere.md#part", "gone/"]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


# The pages speak of the project, its commands and its measurements, not of how they were made.
WORKSHOP_WORDS = re.compile(r"\b(sessions?|lead engineers?|the lead's|helpers?|throwaway)\b", re.I)
HEX = re.compile(r"(?<![0-9A-Za-z_./-])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
DATA_DIGEST = re.compile(r"digest|sha-?256|fingerprint|checksum", re.I)
URL = re.compile(r"https?://[^\s)>]+")
DIGEST_REACH = 80


def workshop_words(text: str) -> list[tuple[int, str]]:
    """What in ``text`` speaks of how the pages were made, each with its line number: the words session(s),
    lead engineer, the lead's, helper(s) and throwaway, and commit hashes.

    The rule: fenced code blocks (program output, pasted logs), code spans (`submitit.helpers...`) and URLs
    (a link may pin an upstream commit) are left out. A commit hash is a run of 7 to 40 lowercase hex
    characters with both a digit and a letter, standing alone (not inside a word, a path or a number). A data
    digest is not one: a hex run with "digest", "sha256", "fingerprint" or "checksum" in the 80 characters
    before it is exempt, so write a digest as "its digest (sha256) 5ad79a4653b6"."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # same length, same lines
    prose = URL.sub(blank, CODE_SPAN.sub(blank, FENCE.sub(blank, text)))
    found = [(m.start(), m.group(0)) for m in WORKSHOP_WORDS.finditer(prose)]
    found += [(m.start(), m.group(0)) for m in HEX.finditer(prose)
              if re.search(r"\d", m.group(0)) and re.search(r"[a-f]", m.group(0))
              and not DATA_DIGEST.search(prose[max(0, m.start() - DIGEST_REACH):m.start()])]
    return [(prose.count("\n", 0, start) + 1, word) for start, word in sorted(found)]


def test_pages_speak_of_the_project_not_of_how_it_was_made():
    hits = [f"{document.relative_to(ROOT)}:{line}: {word}" for document in documents()
            for line, word in workshop_words(document.read_text(encoding="utf-8"))]
    assert not hits, "words about how the pages were made (say what a user can use instead):\n" + "\n".join(hits)


def test_workshop_words_are_found():
    page = ("In this session the lead engineer ran it; the sessions before, the lead's figure,\n"
            "a helper's review and a throwaway script, at commit b10b674 (and 41aa099f).\n"
            "Kept: its digest (sha256) 5ad79a4653b6, the same fingerprint\n(29d6ee07df9b), 1234567 lines, the "
            "word 'defaced', `submitit.helpers.Checkpointable`, a path runs/x/f7d5cb3d,\n"
            "[a pin](https://github.com/o/r/tree/cab1e9a).\n```\nsession 78f0845 in a log\n```\nhelpers, at last\n")
    assert workshop_words(page) == [(1, "session"), (1, "lead engineer"), (1, "sessions"), (1, "the lead's"),
                                    (2, "helper"), (2, "throwaway"), (2, "b10b674"), (2, "41aa099f"),
                                    (9, "helpers")]


def test_the_layout_names_every_module():
    """docs/layout.md names each module of the toolkit and the plugins by its file name."""
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    modules = [p for package in ("nat_kd", "fairseq_plugins") for p in sorted((ROOT / package).rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py")]
    missing = [str(p.relative_to(ROOT)) for p in modules
               if not re.search(r"(?<![\w/.])" + re.escape(p.name) + r"\b", layout)]
    assert len(modules) > 80 and missing == []
