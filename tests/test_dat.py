"""The DA-Transformer: its DAG loss and best path against brute force over every path (and its loss against a
log-space forward algorithm on peaked links), its decoding on a hand-made graph, glancing on the best path
and force-emit, and a micro model through fairseq-train and fairseq-generate."""
import itertools
import math
import re

import pytest
import torch
from conftest import MICRO_MODEL, requires_cuda, run_fairseq
from conftest import COMMON, TRAIN_SENTENCES, hypotheses

from fairseq_plugins.models.dat import (LOG_ZERO, dag_best_path, dag_decode, dag_log_likelihood, force_emit,
                                        glance_vertices, link_log_probs, target_emissions)
from fairseq_plugins.models.nat import STUDENT_FAMILIES
from fairseq_plugins.models.upsampling import upsampled_inputs

UNK, PAD = 3, 1
MICRO_DIMS = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
                  encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                  decoder_attention_heads=2)


def random_graphs(target_lengths, graph_lengths, vocab=6, seed=0, token_std=1.0, link_std=1.0):
    """Random token distributions, links and targets for a padded batch; the targets' padding is PAD. The
    logits of tokens and links have standard deviations ``token_std`` and ``link_std``."""
    generator = torch.Generator().manual_seed(seed)
    batch, length = len(graph_lengths), max(graph_lengths)
    graph_lengths, target_lengths = torch.tensor(graph_lengths), torch.tensor(target_lengths)
    token_log_probs = (token_std * torch.randn(batch, length, vocab, generator=generator)).log_softmax(-1)
    vertex_mask = torch.arange(length)[None, :] < graph_lengths[:, None]
    # query . key / sqrt(8) has variance link_std ** 2 when each has variance link_std
    links = link_log_probs(link_std ** 0.5 * torch.randn(batch, length, 8, generator=generator),
                           link_std ** 0.5 * torch.randn(batch, length, 8, generator=generator), vertex_mask)
    target = torch.randint(0, vocab, (batch, int(target_lengths.max())), generator=generator)
    target = target.masked_fill(torch.arange(target.size(1))[None, :] >= target_lengths[:, None], PAD)
    return token_log_probs, links, target, target_lengths, graph_lengths


def every_path(target_length, graph_length):
    """Every increasing vertex sequence from 0 to the last vertex with one vertex per target token."""
    for middle in itertools.combinations(range(1, graph_length - 1), target_length - 2):
        yield (0, *middle, graph_length - 1)


def path_log_prob(token_log_probs, links, target, path):
    tokens = sum(float(token_log_probs[v, target[t]]) for t, v in enumerate(path))
    return tokens + sum(float(links[i, j]) for i, j in zip(path, path[1:]))


CASES = [([3], [5]),  # a 3-token target on a 5-vertex graph
         ([4, 3, 2, 5], [7, 5, 4, 5])]  # padding in targets and graphs; the last target fills its graph


@pytest.mark.parametrize("target_lengths, graph_lengths", CASES)
def test_dag_loss_is_the_sum_over_every_path(target_lengths, graph_lengths):
    token_log_probs, links, target, t_len, g_len = random_graphs(target_lengths, graph_lengths)
    ours = dag_log_likelihood(target_emissions(token_log_probs, target), links, t_len, g_len)
    for b, (t, g) in enumerate(zip(target_lengths, graph_lengths)):
        paths = [path_log_prob(token_log_probs[b], links[b], target[b], p) for p in every_path(t, g)]
        assert len(paths) == math.comb(g - 2, t - 2)
        assert float(ours[b]) == pytest.approx(math.log(sum(math.exp(p) for p in paths)), abs=1e-5)


def log_space_forward(emissions, links, target_lengths, graph_lengths):
    """The forward algorithm as a logsumexp over every previous vertex at each step, in float64."""
    emissions, links = emissions.double(), links.double()
    score = emissions[:, 0].masked_fill(torch.arange(emissions.size(2)) > 0, float("-inf"))
    scores = [score]
    for t in range(1, emissions.size(1)):
        score = torch.logsumexp(score[:, :, None] + links, 1) + emissions[:, t]
        scores.append(score)
    return torch.stack(scores, 1)[torch.arange(emissions.size(0)), target_lengths - 1, graph_lengths - 1]


def test_dag_loss_is_exact_with_peaked_links_on_a_long_graph():
    # links as peaked as a trained model's (many below -400 nats): the best path of 60 tokens through 480
    # vertices runs far below the graph's favourite cells for many steps; a padded second sentence
    token_log_probs, links, target, t_len, g_len = random_graphs([60, 50], [480, 420], vocab=50, seed=0,
                                                                 token_std=3.0, link_std=60.0)
    emissions = target_emissions(token_log_probs.double(), target).requires_grad_(True)
    links = links.double().requires_grad_(True)
    ours = dag_log_likelihood(emissions, links, t_len, g_len)
    reference = log_space_forward(emissions, links, t_len, g_len)
    assert torch.allclose(ours, reference, rtol=1e-6, atol=0)
    ours_grads = torch.autograd.grad(ours.sum(), (emissions, links))
    reference_grads = torch.autograd.grad(reference.sum(), (emissions, links))
    for mine, theirs in zip(ours_grads, reference_grads):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-6)


def test_links_are_distributions_over_later_real_vertices():
    _, links, _, _, graph_lengths = random_graphs([2, 2], [5, 3])
    for b, g in enumerate(graph_lengths.tolist()):
        for i in range(g - 1):
            assert float(links[b, i, i + 1:g].exp().sum()) == pytest.approx(1.0, abs=1e-6)
            assert (links[b, i, :i + 1] == LOG_ZERO).all() and (links[b, i, g:] == LOG_ZERO).all()


def test_dag_loss_gradient_is_finite_with_padding_and_unreachable_vertices():
    token_log_probs, links, target, t_len, g_len = random_graphs(*CASES[1])
    token_log_probs.requires_grad_(True)
    links.requires_grad_(True)
    dag_log_likelihood(target_emissions(token_log_probs, target), links, t_len, g_len).sum().backward()
    assert torch.isfinite(token_log_probs.grad).all() and torch.isfinite(links.grad).all()


@pytest.mark.parametrize("target_lengths, graph_lengths", CASES)
def test_best_path_is_the_most_probable_path(target_lengths, graph_lengths):
    token_log_probs, links, target, t_len, g_len = random_graphs(target_lengths, graph_lengths, seed=1)
    ours = dag_best_path(target_emissions(token_log_probs, target), links, t_len, g_len)
    for b, (t, g) in enumerate(zip(target_lengths, graph_lengths)):
        best = max(every_path(t, g), key=lambda p: path_log_prob(token_log_probs[b], links[b], target[b], p))
        assert tuple(ours[b, :t].tolist()) == best
        assert (ours[b, t:] == 0).all()


@requires_cuda
def test_dynamic_programmes_and_decoding_agree_on_cuda():
    token_log_probs, links, target, t_len, g_len = random_graphs(*CASES[1], seed=2)
    cpu = (target_emissions(token_log_probs, target), links, t_len, g_len)
    cuda = tuple(x.cuda() for x in cpu)
    assert torch.allclose(dag_log_likelihood(*cuda).cpu(), dag_log_likelihood(*cpu), atol=1e-5)
    assert dag_best_path(*cuda).cpu().equal(dag_best_path(*cpu))
    for lookahead in (False, True):
        tokens, _ = dag_decode(token_log_probs.cuda(), links.cuda(), g_len.cuda(), lookahead, PAD)
        assert tokens.cpu().equal(dag_decode(token_log_probs, links, g_len, lookahead, PAD)[0])


def hand_made_graphs():
    """Two graphs (4 vertices; 3 and a padding vertex) over tokens 4..7, as probabilities."""
    tokens = torch.full((2, 4, 8), 1e-9)
    links = torch.zeros(2, 4, 4)
    # graph 0: vertex -> (most probable token, its probability)
    for v, (token, p) in enumerate([(4, 0.9), (5, 0.4), (6, 0.9), (7, 0.9)]):
        tokens[0, v, 4:] = (1 - p) / 3
        tokens[0, v, token] = p
    links[0, 0, 1:] = torch.tensor([0.5, 0.3, 0.2])
    links[0, 1, 2:] = torch.tensor([0.6, 0.4])
    links[0, 2, 3] = 1.0
    # graph 1: three vertices
    for v, (token, p) in enumerate([(4, 0.9), (5, 0.3), (7, 0.9)]):
        tokens[1, v, 4:] = (1 - p) / 3
        tokens[1, v, token] = p
    links[1, 0, 1:3] = torch.tensor([0.7, 0.3])
    links[1, 1, 2] = 1.0
    return tokens.log(), links.log().clamp(min=LOG_ZERO), torch.tensor([4, 3])


@pytest.mark.parametrize("lookahead, expected, probabilities", [
    # greedy: the most probable link: 0 -> 1 (0.5) -> 2 (0.6) -> 3; 0 -> 1 (0.7) -> 2
    (False, [[4, 5, 6, 7], [4, 5, 7, PAD]], [[0.9, 0.4, 0.9, 0.9], [0.9, 0.3, 0.9, 1.0]]),
    # lookahead from vertex 0: 0.5 x 0.4 = 0.20, 0.3 x 0.9 = 0.27, 0.2 x 0.9 = 0.18 -> vertex 2;
    # graph 1: 0.7 x 0.3 = 0.21 < 0.3 x 0.9 = 0.27 -> vertex 2, the last
    (True, [[4, 6, 7], [4, 7, PAD]], [[0.9, 0.9, 0.9], [0.9, 0.9, 1.0]]),
])
def test_decoding_follows_the_hand_computed_path(lookahead, expected, probabilities):
    token_log_probs, links, graph_lengths = hand_made_graphs()
    tokens, scores = dag_decode(token_log_probs, links, graph_lengths, lookahead, PAD)
    assert tokens.tolist() == expected
    assert torch.allclose(scores.exp(), torch.tensor(probabilities), atol=1e-6)


@pytest.mark.parametrize("lookahead", [False, True])
def test_decoding_emits_a_token_of_consecutive_vertices_once(lookahead):
    # one path through each graph (every vertex links to the next only), so greedy and lookahead agree;
    # row 0 emits 5 at two consecutive vertices (merged), row 1 emits 5, 6, 5 (kept, as is the 7 after it)
    emitted = [[(4, 0.9), (5, 0.8), (5, 0.6), (6, 0.7), (7, 0.9)], [(4, 0.9), (5, 0.8), (6, 0.6), (5, 0.7), (7, 0.5)]]
    token_log_probs = torch.full((2, 5, 8), 1e-9)
    for b, row in enumerate(emitted):
        for v, (token, p) in enumerate(row):
            token_log_probs[b, v, 4:] = (1 - p) / 3
            token_log_probs[b, v, token] = p
    links = torch.zeros(2, 5, 5)
    links[:, range(4), range(1, 5)] = 1.0
    tokens, scores = dag_decode(token_log_probs.log(), links.log().clamp(min=LOG_ZERO), torch.tensor([5, 5]),
                                lookahead, PAD)
    assert tokens.tolist() == [[4, 5, 6, 7, PAD], [4, 5, 6, 5, 7]]
    # a merged run keeps the first vertex's probability: 0.8, not 0.6
    assert torch.allclose(scores.exp(), torch.tensor([[0.9, 0.8, 0.7, 0.9, 1.0], [0.9, 0.8, 0.6, 0.7, 0.5]]),
                          atol=1e-6)


def test_glancing_reveals_the_count_of_mistakes_along_the_best_path():
    vertices = torch.tensor([[UNK] * 10, [UNK] * 6 + [PAD] * 4])
    target = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, PAD, PAD]])
    target_lengths = torch.tensor([5, 3])
    path = torch.tensor([[0, 2, 5, 7, 9], [0, 3, 5, 0, 0]])
    predicted = torch.full((2, 10), 30)
    predicted[0, [0, 2, 5, 7, 9]] = torch.tensor([10, 0, 0, 0, 14])  # 3 mistakes along the path
    predicted[0, :5] = torch.tensor([10, 11, 12, 13, 14])  # compared by position, no mistake at all
    predicted[1, [0, 3, 5]] = torch.tensor([0, 0, 0])  # 3 mistakes
    # the DA-Transformer's number-random: floor(3 x ratio + 0.5)
    for ratio, counts in [(1.0, [3, 3]), (0.6, [2, 2]), (0.4, [1, 1]), (0.1, [0, 0])]:
        for seed in range(5):
            glanced, revealed_tokens = glance_vertices(vertices, path, target, target_lengths, predicted, ratio,
                                                       torch.Generator().manual_seed(seed))
            revealed = glanced.ne(vertices)
            assert revealed.sum(1).tolist() == revealed_tokens.sum(1).tolist() == counts
            for b in range(2):
                on_path = dict(zip(path[b, :target_lengths[b]].tolist(), target[b].tolist()))
                for v in revealed[b].nonzero().flatten().tolist():
                    assert v in on_path and glanced[b, v] == on_path[v]
            assert glanced.eq(PAD).equal(vertices.eq(PAD))


def test_glancing_at_the_final_ratio_reveals_one_of_five_mistakes():
    # at the recipe's final ratio 0.1, 5 mistakes reveal int(5 x 0.1 + 0.5) = 1 token (rounding down: none)
    target = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    path = torch.tensor([[0, 1, 2, 4, 6, 7, 9]])
    predicted = torch.full((1, 10), 30)
    predicted[0, [0, 9]] = torch.tensor([10, 16])  # right at the ends, wrong at the 5 vertices between
    glanced, revealed = glance_vertices(torch.full((1, 10), UNK), path, target, torch.tensor([7]), predicted, 0.1,
                                        torch.Generator().manual_seed(0))
    assert revealed.sum().item() == 1 and glanced.ne(UNK).sum().item() == 1


def brute_force_forced_log_likelihood(token_log_probs, links, target, length, graph_length, pinned):
    """log of the sum over every path whose t-th vertex is pinned[t] (where given) of its links and of the
    probabilities of the tokens not pinned."""
    total = 0.0
    for path in every_path(length, graph_length):
        if all(path[t] == v for t, v in pinned.items()):
            tokens = sum(float(token_log_probs[v, target[t]]) for t, v in enumerate(path) if t not in pinned)
            total += math.exp(tokens + sum(float(links[i, j]) for i, j in zip(path, path[1:])))
    return math.log(total)


def test_force_emit_loss_sums_over_the_paths_through_the_glanced_vertices():
    from fairseq_plugins.counting import build_model

    model = build_model("kd_dat_tiny", 20, **MICRO_DIMS)  # only its _nll: the per-token loss of a graph
    # 5 tokens on 8 vertices, the 3rd glanced at vertex 3; 4 tokens on 6 vertices, the 2nd and 3rd at 2 and 4
    token_log_probs, links, target, t_len, g_len = random_graphs([5, 4], [8, 6], seed=3)
    on_target = torch.arange(target.size(1))[None, :] < t_len[:, None]
    target = target.masked_fill(on_target & target.eq(PAD), 0)  # the model finds the length by PAD
    path = torch.tensor([[0, 1, 3, 5, 7], [0, 2, 4, 5, 0]])
    revealed = torch.tensor([[False, False, True, False, False], [False, True, True, False, False]])
    per_token = model._nll((token_log_probs, links), target, g_len, (path, revealed))
    for b, (t, g) in enumerate(zip(t_len.tolist(), g_len.tolist())):
        pinned = {i: int(path[b, i]) for i in range(t) if revealed[b, i]}
        expected = -brute_force_forced_log_likelihood(token_log_probs[b], links[b], target[b], t, g, pinned) / t
        assert float(per_token[b]) == pytest.approx(expected, rel=1e-5)
    # the pins matter: without them, the loss of the whole reference over every path
    assert not torch.allclose(per_token, model._nll((token_log_probs, links), target, g_len), rtol=1e-3)


def test_dat_adds_exactly_its_link_projections():
    from fairseq_plugins.counting import count_parameters

    # query and key projections, 256 x 256 weights and 256 biases each; no length predictor
    assert count_parameters("kd_dat_tiny", 8008) - count_parameters("kd_transformer_tiny", 8008) == 2 * (256 * 256 + 256)


def test_a_reference_longer_than_its_graph_is_left_out_of_the_loss():
    from fairseq_plugins.counting import build_model

    torch.manual_seed(0)
    model = build_model("kd_dat_tiny", 20, upsample_factor=2, **MICRO_DIMS).eval()  # eval: no dropout, no glancing
    bos, eos = model.bos, model.eos
    src = torch.tensor([[bos, 7, 8, eos], [bos, 9, 10, eos]])  # graphs of 8 vertices
    fits = [bos, 11, 12, 13, eos] + [PAD] * 5
    too_long = [bos] + [14] * 8 + [eos]  # 10 tokens

    def loss(rows, targets):
        with torch.no_grad():
            return float(model(src[rows], torch.tensor([4] * len(targets)), None, torch.tensor(targets))["dag"]["loss"])

    assert loss([0, 1], [fits, too_long]) == pytest.approx(loss([0], [fits[:5]]), rel=1e-5)
    assert loss([1], [too_long]) == 0.0
    # and the loss of a sentence is -log P(y | x) per reference token
    with torch.no_grad():
        vertices = upsampled_inputs(src[:1], model.args.upsample_factor, model.unk, model.pad)
        token_log_probs, links = model.decoder.forward_graph(model.encoder(src[:1], src_lengths=torch.tensor([4])),
                                                             vertices)
        target = torch.tensor([fits[:5]])
        log_p = dag_log_likelihood(target_emissions(token_log_probs, target), links, torch.tensor([5]),
                                   torch.tensor([8]))
    assert loss([0], [fits[:5]]) == pytest.approx(-float(log_p) / 5, rel=1e-5)


def epoch_losses(log: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(r"\btrain\b[ |:]+epoch \d+ \| loss ([\d.]+)", log)]


@pytest.mark.slow
def test_micro_dat_learns_and_decodes_every_sentence_greedily(tiny_en_de, tmp_path):
    # test_fairseq_training runs the family's own flags (lookahead decoding) for a few updates
    spec = STUDENT_FAMILIES["dat"]
    task = ("--task", spec.task, "--criterion", "nat_loss", *spec.train_flags)
    # factor 2: graphs half as long, about half the CPU time of this test
    log = run_fairseq("train", tiny_en_de / "bin", *COMMON, *task, "--upsample-factor", "2", "--arch", "kd_dat_tiny",
                      *MICRO_MODEL,
                      "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "1024", "--max-epoch", "2",
                      "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--save-dir", tmp_path)
    first, second = epoch_losses(log)  # the same sentences, shuffled
    assert second < 0.95 * first
    # the glancing statistics reach fairseq-train's epoch lines: the ratio (0.5 for now) and the share glanced
    glanced = [(float(r), float(g)) for r, g in re.findall(r"\| glance_ratio ([\d.]+) \| glanced ([\d.]+)", log)]
    assert len(glanced) == 2 and all(r == 0.5 and 0 < g <= 0.5 for r, g in glanced), glanced
    out = run_fairseq("generate", tiny_en_de / "bin", *COMMON, *task[:2], "--path", tmp_path / "checkpoint_last.pt",
                      "--gen-subset", "train", "--max-tokens", "4096", *spec.decode_flags,
                      "--model-overrides", "{'dat_decoding': 'greedy'}")
    assert sorted(hypotheses(out)) == list(range(TRAIN_SENTENCES))
