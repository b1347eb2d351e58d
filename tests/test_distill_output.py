"""The distilled corpus's source pieces and binarized split, written in bulk, against fairseq's own code."""
from pathlib import Path

import torch
from fairseq.data import Dictionary

from nat_kd.distill.output import binarize
from nat_kd.distill.source import load_binarized, token_strings


def real_tokens(tiny_en_de: Path, dictionary: Dictionary) -> list[torch.Tensor]:
    """The binarized valid source, plus an <unk> inside a sentence and an empty (EOS-only) source."""
    tokens = load_binarized(tiny_en_de / "bin", "valid", "en", "en-de", dictionary)
    unk = torch.cat([tokens[0][:2], torch.tensor([dictionary.unk()]), tokens[0][2:]])
    return tokens + [unk, torch.tensor([dictionary.eos()])]


def test_token_strings_equal_dictionary_string(tiny_en_de):
    dictionary = Dictionary.load(str(tiny_en_de / "bin" / "dict.en.txt"))
    tokens = real_tokens(tiny_en_de, dictionary)
    strings = token_strings(dictionary, tokens)
    assert strings == [dictionary.string(t) for t in tokens]
    assert "<unk>" in strings[-2].split() and strings[-1] == ""


def test_binarized_split_is_byte_identical_to_fairseq_preprocess(tiny_en_de, tmp_path):
    from fairseq import options
    from fairseq_cli import preprocess

    dict_dir = tiny_en_de / "bin"
    source_dict = Dictionary.load(str(dict_dir / "dict.en.txt"))
    source = real_tokens(tiny_en_de, source_dict)
    target = (tiny_en_de / "spm" / "valid.de").read_text(encoding="utf-8").splitlines()
    target += ["▁ein ▁Wort ▁§nie§ ▁gesehen", ""]  # an unknown piece (to <unk>) and an empty output
    pieces = tmp_path / "spm"
    pieces.mkdir()
    for lang, lines in (("en", token_strings(source_dict, source)), ("de", target)):
        (pieces / f"valid.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "en", "--target-lang", "de", "--validpref", str(pieces / "valid"),
        "--destdir", str(tmp_path / "fairseq"), "--srcdict", str(dict_dir / "dict.en.txt"),
        "--tgtdict", str(dict_dir / "dict.de.txt"), "--workers", "1"]))
    (tmp_path / "fairseq" / "preprocess.log").unlink()
    binarize(tmp_path / "ours", "valid", "en", "de", dict_dir, source, target)

    def files(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    ours = files(tmp_path / "ours")
    assert sorted(ours) == ["dict.de.txt", "dict.en.txt", "valid.en-de.de.bin", "valid.en-de.de.idx",
                            "valid.en-de.en.bin", "valid.en-de.en.idx"]
    assert ours == files(tmp_path / "fairseq")
    assert "▁§nie§" not in Dictionary.load(str(dict_dir / "dict.de.txt"))  # really an unknown piece
