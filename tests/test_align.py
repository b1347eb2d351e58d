"""The numpy fast_align against hand-worked cases, a line-by-line reference of fast_align's loops, and the real
fast_align binary's output (test_align_fixtures.py)."""
import math
import random

import numpy as np
import pytest

from nat_kd.analysis.align import (RECOMMENDED, AlignerOptions, FastAlign, _compute_dlogz, _compute_z, digamma,
                                   run_fast_align_binary)
from nat_kd.analysis.formats import (NULL_WORD, Alignments, TranslationTable, format_alignments, format_table,
                                     read_alignments, read_table)
from nat_kd.corpus import CorpusError

TIE = 1e-9  # links whose scores differ by less than this (relative) are decided by rounding, not by the model


# ---------------------------------------------------------------- a plain per-token reference (tests only)

def reference_fast_align(pairs, opt):
    """fast_align.cc's training loop, written token by token with dicts, for comparison."""
    def feature(i, j, m, n):
        return -abs(j / n - i / m)

    def z(i, m, n, lam):
        return sum(math.exp(feature(i, k, m, n) * lam) for k in range(1, n + 1))

    def closed_form_z(i, m, n, lam):
        # da.h's ComputeZ with C's unsigned arithmetic: 'n - floor' wraps when floor > n (only with swapped lengths)
        floor = int(i * n / m)
        ratio = math.exp(-lam / n)
        top = n - floor if floor <= n else math.inf
        ezt = math.exp(feature(i, floor + 1, m, n) * lam) * (1 - ratio ** top) / (1 - ratio) if top else 0.0
        ezb = math.exp(feature(i, floor, m, n) * lam) * (1 - ratio ** floor) / (1 - ratio) if floor else 0.0
        return ezb + ezt

    def dlogz(i, m, n, lam):
        # fast_align's ComputeDLogZ divides by ComputeZ(i, n, m): the two lengths swapped
        numerator = sum(feature(i, k, m, n) * math.exp(feature(i, k, m, n) * lam) for k in range(1, n + 1))
        return numerator / closed_form_z(i, n, m, lam)

    def dg(x):
        r = 0.0
        while x < 7:
            r -= 1 / x
            x += 1
        x -= 0.5
        xx = 1 / x
        xx2 = xx * xx
        xx4 = xx2 * xx2
        return r + math.log(x) + xx2 / 24 - 7 / 960 * xx4 + 31 / 8064 * xx4 * xx2 - 127 / 30720 * xx4 * xx4

    pairs = [(t, s) if opt.reverse else (s, t) for s, t in pairs]
    use_null = not opt.no_null_word
    t_table, lam = None, opt.diagonal_tension
    sizes = {}
    for s, t in pairs:
        sizes[(len(t), len(s))] = sizes.get((len(t), len(s)), 0) + 1
    toks = sum(len(t) for _, t in pairs)
    links = []
    for it in range(opt.iterations):
        final = it == opt.iterations - 1
        counts, emp = {}, 0.0
        for s, t in pairs:
            n, m = len(s), len(t)
            line = []
            for j, f in enumerate(t):
                probs = []
                pa = 1.0 / (n + use_null)
                if use_null:
                    if opt.favor_diagonal:
                        pa = opt.p_null
                    probs.append(((NULL_WORD, f), (t_table or {}).get((NULL_WORD, f), 1e-9) * pa))
                az = z(j + 1, m, n, lam) / (1 - opt.p_null) if opt.favor_diagonal else 0
                for i in range(1, n + 1):
                    if opt.favor_diagonal:
                        pa = math.exp(feature(j + 1, i, m, n) * lam) / az
                    probs.append(((s[i - 1], f), (t_table or {}).get((s[i - 1], f), 1e-9) * pa))
                total = sum(p for _, p in probs)
                if final:
                    # the first maximum (NULL looked at first), plus any other link within rounding of it: the
                    # same word elsewhere in the sentence scores bit-identically under the uniform prior and
                    # always loses to the first; otherwise (other words, or the diagonal prior's equal
                    # distances computed in floating point) rounding decides
                    best_p = max(p for _, p in probs)
                    first = next(k for k, (_, p) in enumerate(probs) if p == best_p)
                    near = {k for k, ((word, _), p) in enumerate(probs)
                            if p >= best_p * (1 - TIE) and (opt.favor_diagonal or word != probs[first][0][0])}
                    line.append({(k - use_null if k >= use_null else None) for k in near | {first}})
                else:
                    for k, (key, p) in enumerate(probs):
                        counts[key] = counts.get(key, 0.0) + p / total
                        if k >= use_null:
                            emp += feature(j, k + 1 - use_null, m, n) * p / total
            links.append(line)
        if final:
            break
        if opt.favor_diagonal and opt.optimize_tension and it > 0:
            for _ in range(8):
                mod = sum(c * dlogz(j, m, n, lam) for (m, n), c in sizes.items() for j in range(1, m + 1)) / toks
                lam += (emp / toks - mod) * 20
                lam = 0.1 if lam <= 0.1 else min(lam, 14)
        totals = {}
        for (e, f), c in counts.items():
            totals[e] = totals.get(e, 0.0) + c + (opt.alpha if opt.variational_bayes else 0)
        if opt.variational_bayes:
            t_table = {k: math.exp(dg(c + opt.alpha) - dg(totals[k[0]])) for k, c in counts.items()}
        else:
            t_table = {k: c / totals[k[0]] for k, c in counts.items()}
    return links[-len(pairs):], t_table, lam


def random_corpus(seed, size=40):
    rng = random.Random(seed)
    src_words, tgt_words = [f"s{k}" for k in range(12)], [f"t{k}" for k in range(15)]
    src, tgt = [], []
    for _ in range(size):
        n = rng.randint(1, 7)
        s = [rng.choice(src_words) for _ in range(n)]
        t = [rng.choice(tgt_words) for _ in range(max(1, n + rng.randint(-2, 2)))]
        src.append(" ".join(s))
        tgt.append(" ".join(t))
    return src, tgt


OPTION_SETS = [
    AlignerOptions(),
    AlignerOptions(favor_diagonal=True),
    RECOMMENDED,
    AlignerOptions(favor_diagonal=True, optimize_tension=True, variational_bayes=True, no_null_word=True),
    AlignerOptions(favor_diagonal=True, variational_bayes=True, reverse=True, iterations=3, p_null=0.2),
    AlignerOptions(variational_bayes=True, alpha=0.5, iterations=4, diagonal_tension=2.0),
]


def assert_links_within_ties(result, ref_links, opt):
    """Each link is the reference's choice, or another one within rounding of it (see reference_fast_align)."""
    ties = 0
    for k, candidates in enumerate(ref_links):
        # the aligned side's position -> the other side's position (or None when NULL wins)
        got = {(i if opt.reverse else j): (j if opt.reverse else i) for i, j in result.alignments.links_of(k)}
        chosen = [got.get(position) for position in range(len(candidates))]
        assert all(c in allowed for c, allowed in zip(chosen, candidates)), (k, chosen, candidates)
        ties += sum(len(allowed) > 1 for allowed in candidates)
    assert ties <= 2  # nearly every link is decided by the model, so the comparison has teeth


@pytest.mark.parametrize("opt", OPTION_SETS, ids=lambda o: o.signature())
def test_matches_token_by_token_reference(opt):
    src, tgt = random_corpus(7)
    result = FastAlign(opt).align_lines(src, tgt)
    ref_links, ref_table, ref_tension = reference_fast_align(
        [(s.split(), t.split()) for s, t in zip(src, tgt)], opt)
    assert_links_within_ties(result, ref_links, opt)
    table = result.table
    ours = {(table.rows[r], table.cols[c]): p for r, c, p in zip(table.row, table.col, table.prob)}
    assert ours.keys() == ref_table.keys()
    for key, p in ref_table.items():
        assert ours[key] == pytest.approx(p, rel=1e-9, abs=1e-300)
    if opt.favor_diagonal and opt.optimize_tension:
        assert result.final_tension == pytest.approx(ref_tension, rel=1e-9)
        assert result.final_tension != opt.diagonal_tension


def test_single_pair_by_hand():
    # Model 1 with NULL: iteration 1 splits x's count evenly between NULL and a, so t(x|a) = t(x|NULL) = 1;
    # in the final pass NULL and a tie and NULL, looked at first, wins: no link.
    result = FastAlign(AlignerOptions(iterations=2)).align_lines(["a"], ["x"])
    assert format_alignments(result.alignments) == "\n"
    assert sorted(result.table.prob.tolist()) == [1.0, 1.0]
    # with favour-diagonal the prior is p_null = 0.08 for NULL against 0.92 for a: a wins
    result = FastAlign(AlignerOptions(iterations=2, favor_diagonal=True)).align_lines(["a"], ["x"])
    assert format_alignments(result.alignments) == "0-0\n"


def test_monotone_corpus_aligns_on_the_diagonal():
    src = ["a b c", "b c a", "c a b", "a c b"]
    tgt = ["x y z", "y z x", "z x y", "x z y"]
    result = FastAlign(RECOMMENDED).align_lines(src, tgt)
    assert format_alignments(result.alignments) == "0-0 1-1 2-2\n" * 4


def test_reverse_still_writes_source_target_pairs():
    # Worked by hand, -d (p_null 0.08, tension 4) -I 2: one pass of counts, then the Viterbi pass. The diagonal
    # prior of position i among n for the word at j of m is exp(-4 |i/n - j/m|), normalised over i, times 0.92.
    # Reverse (-r): each SOURCE word picks a target word or NULL. Line 1 (a b | x): a and b each give x 0.92 and
    # NULL 0.08. Line 2 (a | x y): a gives x 0.92 e^-2 / (1 + e^-2) = 0.109667, y 0.810333, NULL 0.08.
    # So t(a|x) = 1.029667 / 1.949667 = 0.528124, t(b|x) = 0.471876, t(a|y) = 1, t(a|NULL) = 2/3, t(b|NULL) = 1/3.
    # Viterbi: line 1 a -> x (0.92 * 0.528 against NULL's 0.053), b -> x (0.434 against 0.027); line 2
    # a -> y (0.810 against x's 0.058 and NULL's 0.053). Written source-target: "0-0 1-0" and "0-1".
    src, tgt = ["a b", "a"], ["x", "x y"]
    options = dict(favor_diagonal=True, iterations=2)
    reverse = FastAlign(AlignerOptions(reverse=True, **options)).align_lines(src, tgt)
    assert format_alignments(reverse.alignments) == "0-0 1-0\n0-1\n"
    assert reverse.alignments.links_of(0) == [(0, 0), (1, 0)]  # (source index, target index)
    table = reverse.table  # rows: the target side (and NULL), as fast_align -r -p prints it
    assert {(table.rows[r], table.cols[c]): p for r, c, p in zip(table.row.tolist(), table.col.tolist(),
                                                                   table.prob.tolist())} == pytest.approx(
        {("x", "a"): 0.528124, ("x", "b"): 0.471876, ("y", "a"): 1.0, (NULL_WORD, "a"): 2 / 3,
         (NULL_WORD, "b"): 1 / 3}, abs=1e-6)
    # Forward, the mirror image: each TARGET word picks a source word, line 1 x -> b (0.810 against a's 0.058),
    # line 2 x -> a and y -> a. Another set of pairs on every line: the direction is not ignored.
    forward = FastAlign(AlignerOptions(**options)).align_lines(src, tgt)
    assert format_alignments(forward.alignments) == "1-0\n0-0 0-1\n"


def test_digamma_matches_known_values():
    values = digamma(np.array([1.0, 0.5, 0.01, 10.0]))
    expected = [-0.5772156649015329, -1.9635100260214235, -100.56088545786867, 2.251752589066721]
    assert values == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("j1,m,n,lam", [(1, 5, 7, 4.0), (3, 3, 2, 0.5), (4, 9, 1, 14.0), (7, 7, 7, 6.6)])
def test_closed_form_z_and_its_derivative(j1, m, n, lam):
    feats = [-abs(i / n - j1 / m) for i in range(1, n + 1)]
    z = sum(math.exp(f * lam) for f in feats)
    dz = sum(f * math.exp(f * lam) for f in feats)
    f64 = np.float64
    assert float(_compute_z(f64(j1), f64(m), f64(n), lam)) == pytest.approx(z, rel=1e-10)
    # fast_align's model feature: the true numerator over Z computed with m and n swapped ...
    swapped_z = float(_compute_z(f64(j1), f64(n), f64(m), lam))
    assert float(_compute_dlogz(f64(j1), f64(m), f64(n), lam)) == pytest.approx(dz / swapped_z, rel=1e-8)
    if m == n:  # ... which is d log Z / d tension exactly when the sentence lengths are equal
        assert float(_compute_dlogz(f64(j1), f64(m), f64(n), lam)) == pytest.approx(dz / z, rel=1e-8)


def test_swapped_z_wraps_like_unsigned_arithmetic():
    # Z(i=4, m=2, n=3): floor(4 * 3 / 2) = 6 > n, so C's unsigned n - floor wraps to about 2**32 and
    # ratio**that is 0: the top series is exp(feature(4, 7, 2, 3) * lam) / (1 - ratio), the bottom one
    # exp(feature(4, 6, 2, 3) * lam) * (1 - ratio**6) / (1 - ratio).
    lam = 2.0
    ratio = math.exp(-lam / 3)
    top = math.exp(-abs(7 / 3 - 4 / 2) * lam) / (1 - ratio)
    bottom = math.exp(-abs(6 / 3 - 4 / 2) * lam) * (1 - ratio ** 6) / (1 - ratio)
    assert float(_compute_z(np.float64(4), np.float64(2), np.float64(3), lam)) == pytest.approx(top + bottom, rel=1e-12)


def test_one_iteration_has_no_table():
    result = FastAlign(AlignerOptions(iterations=1)).align_lines(["a"], ["x"])
    with pytest.raises(CorpusError, match="at least 2 iterations"):
        result.exported_table()


def test_empty_sentence_is_refused():
    with pytest.raises(CorpusError, match="line 2: empty sentence"):
        FastAlign().align_lines(["a", ""], ["x", "y"])


# ---------------------------------------------------------------- formats

def small_table():
    return TranslationTable([NULL_WORD, "a"], ["x", "y", "z", "w"], np.array([0, 1, 1, 1, 1]),
                            np.array([0, 0, 1, 2, 3]), np.array([0.3, 0.5, 0.1, 0.05, 0.01]))


def test_beam_threshold_keeps_p_at_least_max_to_the_fourth():
    pruned = small_table().pruned(-4.0)  # row a: max 0.5, 0.5**4 = 0.0625 keeps 0.5 and 0.1
    assert sorted(zip(pruned.row.tolist(), pruned.prob.tolist())) == [(0, 0.3), (1, 0.1), (1, 0.5)]


def test_table_text_is_fast_align_format(tmp_path):
    text = format_table(small_table())
    assert text.splitlines()[:2] == ["<eps>\tx\t-1.20397", "a\tx\t-0.693147"]
    (tmp_path / "t.txt").write_text(text)
    back = read_table(tmp_path / "t.txt")
    assert back.rows == [NULL_WORD, "a"] and back.prob == pytest.approx(small_table().prob, rel=1e-5)


@pytest.mark.parametrize("line,why", [("a\tx", "malformed table line"), ("a\tx\tabc", "not a number"),
                                      ("a\tx\t0.5", "> 0")])
def test_malformed_table_line_names_file_and_line(tmp_path, line, why):
    path = tmp_path / "bad.txt"
    path.write_text("a\ty\t-0.1\n" + line + "\n")
    with pytest.raises(CorpusError, match=rf"bad.txt:2: .*{why}"):
        read_table(path)


def test_pharaoh_round_trip_and_errors(tmp_path):
    al = Alignments(np.array([0, 0, 2]), np.array([0, 1, 3]), np.array([1, 0, 2]), 3)
    text = format_alignments(al)
    assert text == "0-1 1-0\n\n3-2\n"
    (tmp_path / "a.txt").write_text(text)
    back = read_alignments(tmp_path / "a.txt")
    assert back.num_sentences == 3 and back.links_of(2) == [(3, 2)]
    (tmp_path / "b.txt").write_text("0-1\n1-x\n")
    with pytest.raises(CorpusError, match="b.txt:2: malformed alignment link '1-x'"):
        read_alignments(tmp_path / "b.txt")


# ---------------------------------------------------------------- the real binary path, with a fake binary

FAKE_FAST_ALIGN = """#!/bin/sh
# records its arguments, prints fixed links and writes a fixed -p table
echo "$@" > "$(dirname "$0")/args.txt"
while [ $# -gt 0 ]; do
  if [ "$1" = "-p" ]; then printf 'a\\tx\\t-0.1\\nb\\ty\\t-0.2\\n' > "$2"; fi
  shift
done
printf '0-0\\n0-0 1-1\\n'
"""


@pytest.fixture
def fake_fast_align(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "fast_align"
    exe.write_text(FAKE_FAST_ALIGN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return bin_dir


def test_binary_output_is_parsed(fake_fast_align):
    result = run_fast_align_binary(["a", "a b"], ["x", "x y"], RECOMMENDED)
    assert result.alignments.links_of(1) == [(0, 0), (1, 1)]
    table = result.exported_table()
    assert table.rows == ["a", "b"] and table.prob == pytest.approx([math.exp(-0.1), math.exp(-0.2)])
    args = (fake_fast_align / "args.txt").read_text().split()
    assert {"-d", "-o", "-v", "-p"} <= set(args) and args[args.index("-I") + 1] == "5"
    assert args[args.index("-T") + 1] == "4.0"


def test_binary_gets_no_tension_without_diagonal(fake_fast_align):
    # fast_align's -T switches -d on, so a plain Model 1 run must not pass it
    run_fast_align_binary(["a", "b"], ["x", "y"], AlignerOptions())
    assert "-T" not in (fake_fast_align / "args.txt").read_text().split()


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CorpusError, match="no 'fast_align' executable on PATH"):
        run_fast_align_binary(["a"], ["x"], RECOMMENDED)


@pytest.mark.parametrize("shard_links", [10 ** 9, 40])
def test_pair_ids_match_numpy_unique(monkeypatch, shard_links):
    import nat_kd.analysis.align as align_module
    from nat_kd.analysis.align import _Corpus

    src, tgt = random_corpus(5, size=60)
    monkeypatch.setattr(align_module, "CHUNK_LINKS", 13)  # several chunks
    corpus = _Corpus(((s.split(), t.split()) for s, t in zip(src, tgt)), False, shard_links)
    assert (len(corpus.store) == 1) == (shard_links == 10 ** 9)
    words = [(s_word, t_word) for s, t in zip(src, tgt) for t_word in t.split() for s_word in s.split()]
    keys = np.array([corpus.src_vocab.index(a) * len(corpus.tgt_vocab) + corpus.tgt_vocab.index(b) for a, b in words])
    expected_keys, expected_pair = np.unique(keys, return_inverse=True)
    shards = list(corpus.shards())
    assert (np.concatenate([shard.pair for shard in shards]) == expected_pair).all()
    assert corpus.num_entries == len(expected_keys) + len(corpus.tgt_vocab)
    # every link's prior cell holds its own (j, i, m, n)
    flat = [(j + 1, i + 1, len(t.split()), len(s.split())) for s, t in zip(src, tgt)
            for j in range(len(t.split())) for i in range(len(s.split()))]
    prior = corpus.prior
    cells = np.stack([prior.block_j1, prior.block_i1, prior.block_m, prior.block_n], axis=1)
    assert (np.concatenate([cells[shard.prior_index] for shard in shards]) == np.array(flat)).all()


def test_shards_spill_to_disk_and_read_back():
    from nat_kd.analysis.align import _ShardStore

    store = _ShardStore()
    first = {"a": np.arange(5, dtype=np.int32)}
    store.add(first)
    assert store.get(0)["a"] is first["a"]  # one shard: kept in memory
    store.add({"a": np.arange(3, dtype=np.int64)})
    files = sorted(p.name for p in __import__("pathlib").Path(store._folder.name).iterdir())
    assert files == ["0.a.npy", "1.a.npy"]  # a second shard moves both to disk
    assert store.get(0)["a"].tolist() == [0, 1, 2, 3, 4] and store.get(1)["a"].dtype == np.int64
    store.update(1, {"a": None, "b": np.ones(2)})
    assert sorted(store.get(1)) == ["b"]


def test_chunked_e_step_gives_the_same_model(monkeypatch):
    import nat_kd.analysis.align as align_module

    src, tgt = random_corpus(11)
    whole = FastAlign(RECOMMENDED).align_lines(src, tgt)
    monkeypatch.setattr(align_module, "CHUNK_LINKS", 7)
    pieces = FastAlign(RECOMMENDED).align_lines(src, tgt)
    # chunks change the order counts are summed in, so links on rounding ties may go either way
    ref_links = reference_fast_align([(s.split(), t.split()) for s, t in zip(src, tgt)], RECOMMENDED)[0]
    assert_links_within_ties(whole, ref_links, RECOMMENDED)
    assert_links_within_ties(pieces, ref_links, RECOMMENDED)
    assert pieces.table.prob == pytest.approx(whole.table.prob, rel=1e-12)
    assert pieces.final_tension == pytest.approx(whole.final_tension, rel=1e-12)


def test_align_file_reads_fast_align_input(tmp_path):
    (tmp_path / "c.txt").write_text("a b ||| x y\nb  c |||  y z\n")
    from_file = FastAlign(RECOMMENDED).align_file(tmp_path / "c.txt")
    from_lines = FastAlign(RECOMMENDED).align_lines(["a b", "b c"], ["x y", "y z"])
    assert format_alignments(from_file.alignments) == format_alignments(from_lines.alignments)
    (tmp_path / "bad.txt").write_text("a b ||| x\na b x\n")
    with pytest.raises(CorpusError, match="bad.txt:2: no ' \\|\\|\\| ' separator"):
        FastAlign().align_file(tmp_path / "bad.txt")


@pytest.mark.parametrize("line,src,tgt", [
    ("a b ||| x y", ["a", "b"], ["x", "y"]),
    ("a\t|||\tx ||| y", ["a"], ["x", "|||", "y"]),  # the first '|||' token splits, whatever the spacing
    ("a|||b ||| x", ["a|||b"], ["x"]),             # '|||' inside a token is not a separator
    ("|||x ||| y", ["|||x"], ["y"]),
])
def test_fast_align_input_splits_at_the_first_separator_token(tmp_path, line, src, tgt):
    from nat_kd.analysis.formats import iter_parallel_tokens

    (tmp_path / "c.txt").write_text(line + "\n")
    assert list(iter_parallel_tokens(tmp_path / "c.txt")) == [(src, tgt)]

