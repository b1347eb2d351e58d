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
