"""The Directed Acyclic Transformer (DA-Transformer; Huang et al., ICML 2022), fairseq model ``dat``.

The decoder does not predict a length: it has L = upsample_factor x source-length vertices, each with a token
distribution, and links (transition probabilities) from every vertex to every later one. A translation is a
path from vertex 0 to vertex L-1 emitting one token per visited vertex, so the graph holds many translations
at once and the model never has to commit to one token per fixed position. Training maximises the
probability of the reference summed over all its paths (a dynamic programme over target positions); glancing
reveals reference tokens at the vertices of the reference's most probable path, and the trained pass's loss
sums only over the paths through those vertices, without the revealed tokens' own probabilities (the
reference code's force-emit). Decoding follows the links from vertex 0 (greedy or lookahead), in one pass.

Targets include fairseq's <s> and </s> (``translation_lev`` adds them), so vertex 0 learns <s> and the last
vertex </s>. A reference longer than its graph has no path: such sentences are left out of the batch's mean
(the reference code counts them in it with loss 0, which only scales the batch's gradient down by their
share; the paper filters them from the corpus); ``--upsample-factor`` is what keeps them rare.
"""
import math

import torch
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATModel
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture
from torch import nn

from .glancing import (Glancing, GlancingDecoder, add_glancing_args, glance_count, glancing_defaults, glancing_mask,
                       predicted_tokens)
from .upsampling import UpsampledStudent, collapse_repeats, upsampled_inputs

# A finite log(0) for forbidden links and unreachable cells: -inf would turn into NaN in the sums and
# differences of the dynamic programmes (-inf - -inf), and their gradients.
LOG_ZERO = -1e9

DECODING_STRATEGIES = ("lookahead", "greedy")

# The reference code's recipe (thu-coai/DA-Transformer, README: --glat-p 0.5:0.1@200k of --max-update 300000)
DAT_ANNEAL_UPDATES = 200_000

# A sum of the forward algorithm more than this many nats below its step's best cell may have lost terms to
# float64's underflow (below e^-708): such a cell is summed again in log space.
PRECISE_LOG_SUM = -600.0


def link_log_probs(query: torch.Tensor, key: torch.Tensor, vertex_mask: torch.BoolTensor) -> torch.Tensor:
    """log P(next vertex j | vertex i), [B, L, L]: scaled dot products, normalised over the later real vertices
    j > i. Rows with no later vertex (the last vertex, padding) and forbidden links hold LOG_ZERO."""
    scores = torch.bmm(query.float(), key.float().transpose(1, 2)) / math.sqrt(query.size(-1))
    length = vertex_mask.size(1)
    later = torch.ones(length, length, dtype=torch.bool, device=scores.device).triu(1)
    allowed = later[None] & vertex_mask[:, None, :]
    return scores.masked_fill(~allowed, LOG_ZERO).log_softmax(-1).masked_fill(~allowed, LOG_ZERO)


def target_emissions(token_log_probs: torch.Tensor, target: torch.LongTensor) -> torch.Tensor:
    """log P(y_t | vertex j) for every target position t and vertex j: [B, T, L] from [B, L, V] and [B, T]."""
    index = target[:, None, :].expand(-1, token_log_probs.size(1), -1)
    return token_log_probs.gather(2, index).transpose(1, 2)


def _first_vertex_only(emissions: torch.Tensor) -> torch.Tensor:
    """Scores of the first target token: every path starts at vertex 0."""
    return emissions[:, 0].masked_fill(torch.arange(emissions.size(2), device=emissions.device) > 0, LOG_ZERO)


def dag_log_likelihood(emissions: torch.Tensor, links: torch.Tensor, target_lengths: torch.LongTensor,
                       graph_lengths: torch.LongTensor) -> torch.Tensor:
    """log P(y | x) of each sentence [B]: the sum over all paths from vertex 0 to its last vertex that visit
    exactly |y| vertices, of the product of their links and of the visited vertices' probabilities of y.

    Forward algorithm over target positions, in float64: score[t, j] sums the paths emitting y_0..y_t whose
    t-th vertex is j. Each step is one batched product of the previous scores (as probabilities, scaled by
    their maximum) with the link probabilities: a matrix product instead of a logsumexp over [B, L, L], one
    pass over the links instead of six, forward and backward. The product is exact for every cell within
    PRECISE_LOG_SUM of its step's best; a cell further below (peaked links make many: the path the reference
    needs can run hundreds of nats below the graph's favourite one for several steps) is summed again by
    logsumexp over its incoming links. Cells no path of |y| vertices visits (j < t, or too close to the end
    to reach it in time) hold LOG_ZERO, so that nothing from them leaks into the others.
    """
    dtype = emissions.dtype
    emissions, links = emissions.double(), links.double()
    transitions = links.exp()
    vertex = torch.arange(emissions.size(2), device=emissions.device)[None, :]
    latest = (graph_lengths - target_lengths)[:, None]  # the t-th vertex of a path is in [t, latest + t]
    score = _first_vertex_only(emissions)
    scores = [score]
    for t in range(1, emissions.size(1)):
        # the result does not depend on the shift, so no gradient goes through it
        shift = score.detach().max(1, keepdim=True).values
        reached = torch.bmm((score - shift).exp()[:, None, :], transitions).squeeze(1)
        # clamped: log(0) would give NaN gradients (those cells are replaced below)
        summed = reached.clamp(min=torch.finfo(reached.dtype).tiny).log()
        on_path = (vertex >= t) & (vertex <= latest + t) & (t < target_lengths)[:, None]
        imprecise = on_path & (summed.detach() < PRECISE_LOG_SUM)
        summed = summed + shift
        if bool(imprecise.any()):
            rows, cells = imprecise.nonzero(as_tuple=True)
            summed = summed.index_put((rows, cells), torch.logsumexp(score[rows] + links[rows, :, cells], 1))
        score = torch.where(on_path, summed + emissions[:, t], LOG_ZERO)
        scores.append(score)
    rows = torch.arange(emissions.size(0), device=emissions.device)
    return torch.stack(scores, 1)[rows, target_lengths - 1, graph_lengths - 1].to(dtype)


def force_emit(emissions: torch.Tensor, path: torch.LongTensor, revealed: torch.BoolTensor) -> torch.Tensor:
    """Emissions [B, T, L] with each revealed reference token ([B, T]) pinned to its vertex on ``path``
    ([B, T]): log 1 there, LOG_ZERO at every other vertex. The DAG loss then sums over the paths through the
    revealed tokens' vertices only, and leaves out their probabilities, which the trained pass was shown (the
    reference code's force-emit, ``_force_aligment`` in thu-coai/DA-Transformer's nat_dag_loss.py)."""
    pinned = torch.where(F.one_hot(path, emissions.size(2)).bool(), 0.0, LOG_ZERO).to(emissions.dtype)
    return torch.where(revealed[:, :, None], pinned, emissions)


def dag_best_path(emissions: torch.Tensor, links: torch.Tensor, target_lengths: torch.LongTensor,
                  graph_lengths: torch.LongTensor) -> torch.LongTensor:
    """The vertex of each target token on the reference's most probable path, [B, T] (0 past |y|): the
    forward algorithm with max for sum (Viterbi), then back along the best previous vertices."""
    score = _first_vertex_only(emissions)
    backpointers = []
    incoming = links.transpose(1, 2).contiguous()  # [B, to, from]: each step reduces over contiguous memory
    for t in range(1, emissions.size(1)):
        best, previous = (score[:, None, :] + incoming).max(2)
        backpointers.append(previous)
        score = best + emissions[:, t]
    batch, length = emissions.shape[:2]
    path = torch.zeros(batch, length, dtype=torch.long, device=emissions.device)
    vertex = graph_lengths - 1
    for t in range(length - 1, -1, -1):
        on_target = t < target_lengths
        path[:, t] = torch.where(on_target, vertex, 0)
        if t > 0:
            previous = backpointers[t - 1].gather(1, vertex[:, None]).squeeze(1)
            vertex = torch.where(on_target, previous, vertex)
    return path


def dag_decode(token_log_probs: torch.Tensor, links: torch.Tensor, graph_lengths: torch.LongTensor,
               lookahead: bool, pad: int):
    """Follow the links from vertex 0 to the last vertex; returns (tokens, their log-probabilities), [B, S],
    padded. Each visited vertex emits its most probable token, and a token emitted by consecutive vertices of
    the path counts once (as in the reference implementation's greedy and lookahead decoding: the model gives
    a word several vertices, and without the merge a half-trained graph repeats words and outputs grow far
    past the reference's length). Greedy takes the most probable link; lookahead the link that maximises the
    link's probability times the next vertex's best token's."""
    token_scores, tokens = token_log_probs.max(-1)
    successor = (links + token_scores[:, None, :] if lookahead else links).argmax(-1)
    last = graph_lengths - 1
    vertex = torch.zeros_like(last)
    path = [vertex]
    # every link goes forward, so L - 1 steps reach the last vertex
    for _ in range(int(graph_lengths.max()) - 1):
        if bool((vertex == last).all()):
            break
        vertex = torch.where(vertex == last, vertex, successor.gather(1, vertex[:, None]).squeeze(1))
        path.append(vertex)
    path = torch.stack(path, 1)
    # a path stops at its first visit of the last vertex; the rest of its row repeats that vertex
    finished = F.pad((path == last[:, None])[:, :-1], (1, 0), value=False)
    return collapse_repeats(tokens.gather(1, path).masked_fill(finished, pad),
                            token_scores.gather(1, path).masked_fill(finished, 0.0), pad)[:2]


def glance_vertices(vertices: torch.LongTensor, path: torch.LongTensor, target: torch.LongTensor,
                    target_lengths: torch.LongTensor, predicted: torch.LongTensor, ratio: float,
                    generator: torch.Generator = None) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Decoder inputs with reference tokens revealed, and which reference tokens ([B, T]): the first pass's
    tokens (``predicted``, [B, L]) read along the best ``path`` differ from the reference at ``hamming``
    positions (<s> and </s> included, as in the reference code); ``floor(hamming x ratio + 0.5)`` reference
    tokens chosen at random (the reference code's ``number-random``) are written at their path vertices (the
    rest stay <unk>)."""
    on_target = torch.arange(target.size(1), device=target.device)[None, :] < target_lengths[:, None]
    hamming = (predicted.gather(1, path).ne(target) & on_target).sum(1)
    revealed = glancing_mask(on_target, glance_count(hamming, ratio, round_half_up=True), generator)
    rows = torch.arange(target.size(0), device=target.device)[:, None].expand_as(path)
    glanced = vertices.clone()
    glanced[rows[revealed], path[revealed]] = target[revealed]  # a path's vertices are distinct
    return glanced, revealed


class DATransformerDecoder(GlancingDecoder):
    """The glancing NAT decoder run over the graph's vertices (<unk>, or a glanced reference token), plus the
    link projections."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.embed_length = None  # no length prediction
        self.link_query = nn.Linear(self.output_embed_dim, self.output_embed_dim)
        self.link_key = nn.Linear(self.output_embed_dim, self.output_embed_dim)

    def forward_graph(self, encoder_out, vertices):
        """(log P(token | vertex) [B, L, V], log P(next vertex | vertex) [B, L, L]), in float32."""
        features, _ = self.extract_features(vertices, encoder_out=encoder_out, embedding_copy=True)
        token_log_probs = F.log_softmax(self.output_layer(features).float(), dim=-1)
        links = link_log_probs(self.link_query(features), self.link_key(features), vertices.ne(self.padding_idx))
        return token_log_probs, links


@register_model("dat")
class DATransformerModel(UpsampledStudent, Glancing, FairseqNATModel):
    """Encoder as fairseq's NAT; a decoder over the graph's vertices (no length predictor: the graph size
    comes from the source length, which is why this is not a NATransformerModel)."""

    decoder_class, model_name = DATransformerDecoder, "dat (DA-Transformer)"

    @staticmethod
    def add_args(parser):
        FairseqNATModel.add_args(parser)
        parser.add_argument("--upsample-factor", type=int,
                            help="graph vertices per source token (default 8, as the paper)")
        add_glancing_args(parser)
        parser.add_argument("--dat-decoding", choices=DECODING_STRATEGIES,
                            help="path through the graph at decoding: lookahead (default) or greedy; at "
                                 "fairseq-generate: --model-overrides \"{'dat_decoding': 'greedy'}\"")

    @property
    def allow_ensemble(self):
        return False  # the graphs of two models have no common vertices to average

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, **kwargs)
        vertices = upsampled_inputs(src_tokens, self.args.upsample_factor, self.unk, self.pad)
        per_token = self._trained_nll(encoder_out, vertices, tgt_tokens)
        return {"dag": {"loss": _mean_of_fitting(per_token), "factor": 1.0}}

    def forward_references(self, src_tokens, src_lengths, references, selection: str):
        """The loss over several references per sentence (``references`` [B, K, T], each framed <s> ... </s>,
        all padding where a line has fewer), as CTCNATModel.forward_references: "min" trains each sentence on
        the reference its first pass gives the highest probability per token (one longer than the graph is
        never chosen), glancing at it; "mean" on every fitting reference, averaged."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        vertices = upsampled_inputs(src_tokens, self.args.upsample_factor, self.unk, self.pad)
        lengths = vertices.ne(self.pad).sum(1)
        candidates = [references[:, k, :max(int(references[:, k].ne(self.pad).sum(1).max()), 1)]
                      for k in range(references.size(1))]
        fitting = torch.stack([(r.ne(self.pad).sum(1) <= lengths) & r.ne(self.pad).any(1) for r in candidates], 1)
        if selection == "mean":
            per_token = torch.stack([self._trained_nll(encoder_out, vertices, r) for r in candidates], 1)
            per_token = per_token.masked_fill(~fitting, 0.0).sum(1) / fitting.sum(1).clamp(min=1)
            return {"dag": {"loss": _mean_of_fitting(per_token.masked_fill(~fitting.any(1), float("inf"))),
                            "factor": 1.0}}
        if selection != "min":
            raise ValueError(f"reference selection {selection!r}: 'min' or 'mean'")
        glancing = self.current_glance_ratio() > 0
        with torch.set_grad_enabled(torch.is_grad_enabled() and not glancing):
            first = self.decoder.forward_graph(encoder_out, vertices)  # the trained pass when not glancing
        per_token = torch.stack([self._nll(first, r, lengths) for r in candidates], 1)
        chosen = per_token.detach().masked_fill(~fitting, float("inf")).argmin(1)
        if not glancing:
            return {"dag": {"loss": _mean_of_fitting(per_token.gather(1, chosen.unsqueeze(1)).squeeze(1)
                                                     .masked_fill(~fitting.any(1), float("inf"))), "factor": 1.0}}
        width = max(r.size(1) for r in candidates)
        stacked = torch.stack([F.pad(r, (0, width - r.size(1)), value=self.pad) for r in candidates], 1)
        selected = stacked[torch.arange(stacked.size(0), device=stacked.device), chosen]
        selected = selected[:, :int(selected.ne(self.pad).sum(1).max())]
        first = tuple(t.detach() for t in first)
        return {"dag": {"loss": _mean_of_fitting(self._trained_nll(encoder_out, vertices, selected, first)),
                        "factor": 1.0}}

    def _nll(self, graph, tgt_tokens, lengths, glanced=None):
        """Per-token negative log-likelihood of each sentence's reference under ``graph`` (token log-probs,
        links); inf where the reference is longer than the graph. ``glanced``: (best path, revealed), the
        revealed tokens forced onto their vertices; the division is by the whole reference's length, as the
        reference code's."""
        token_log_probs, links = graph
        target_lengths = tgt_tokens.ne(self.pad).sum(1)
        emissions = target_emissions(token_log_probs, tgt_tokens)
        if glanced is not None:
            emissions = force_emit(emissions, *glanced)
        log_likelihood = dag_log_likelihood(emissions, links, target_lengths, lengths)
        per_token = -log_likelihood / target_lengths.clamp(min=1)
        return per_token.masked_fill(target_lengths > lengths, float("inf"))

    def _trained_nll(self, encoder_out, vertices, tgt_tokens, first=None):
        """The trained pass's per-token loss of each sentence's reference (inf where it is longer than the
        graph), glancing at it; ``first``: the untrained-on pass's graph, when the caller has it already."""
        lengths = vertices.ne(self.pad).sum(1)
        target_lengths = tgt_tokens.ne(self.pad).sum(1)
        ratio = self.current_glance_ratio()
        glanced = None
        if ratio > 0:
            with torch.no_grad():
                token_log_probs, links = first or self.decoder.forward_graph(encoder_out, vertices)
                path = dag_best_path(target_emissions(token_log_probs, tgt_tokens), links, target_lengths, lengths)
                vertices, revealed = glance_vertices(vertices, path, tgt_tokens, target_lengths,
                                                     predicted_tokens(token_log_probs), ratio)
            self.log_glancing(ratio, revealed, tgt_tokens.ne(self.pad))
            glanced = (path, revealed)
        return self._nll(self.decoder.forward_graph(encoder_out, vertices), tgt_tokens, lengths, glanced)

    def forward_decoder(self, decoder_out, encoder_out, decoding_format=None, **kwargs):
        if decoder_out.step > 0:
            raise ValueError("the DA-Transformer decodes in one pass: run fairseq-generate with "
                             "--iter-decode-max-iter 0")
        vertices = decoder_out.output_tokens
        token_log_probs, links = self.decoder.forward_graph(encoder_out, vertices)
        tokens, scores = dag_decode(token_log_probs, links, vertices.ne(self.pad).sum(1),
                                    self.args.dat_decoding == "lookahead", self.pad)
        history = decoder_out.history
        if history is not None:
            history.append(tokens.clone())
        return decoder_out._replace(output_tokens=tokens, output_scores=scores.type_as(decoder_out.output_scores),
                                    attn=None, history=history)


def _mean_of_fitting(per_token: torch.Tensor) -> torch.Tensor:
    """The per-token losses averaged over the sentences (as the paper); a sentence whose reference is longer
    than its graph (inf) has no path and is left out."""
    fits = torch.isfinite(per_token)
    return per_token[fits].sum() / fits.sum().clamp(min=1)


def dat_base_architecture(args):
    # the paper and the reference code's recipe anneal the glancing ratio 0.5 -> 0.1
    glancing_defaults(args, start=0.5, end=0.1, anneal_updates=DAT_ANNEAL_UPDATES)
    nat_base_architecture(args)
    args.upsample_factor = getattr(args, "upsample_factor", 8)
    args.dat_decoding = getattr(args, "dat_decoding", "lookahead")


register_model_architecture("dat", "dat")(dat_base_architecture)
