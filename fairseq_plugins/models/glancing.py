"""Glancing (Qian et al., ACL 2021), shared by GLAT, CTC with glancing and the DA-Transformer.

During training a first decoder pass without gradients measures how far the model is from the reference
(the Hamming distance); the worse it is, the more reference tokens are revealed ("glanced") to the second,
trained pass, whose loss covers only what it was not shown. The ratio of the distance revealed is annealed
over training.

The tensor functions (ratio, count, mask) serve any model; ``Glancing`` (the ratio of the current update),
the option helpers and ``GlancingDecoder`` (revealed tokens embedded, the source copied uniformly elsewhere)
serve GLAT, CTC and the DA-Transformer.
"""
import torch
from fairseq.logging import metrics
from fairseq.models.nat.nonautoregressive_transformer import NATransformerDecoder
from fairseq.modules.transformer_sentence_encoder import init_bert_params

# GLAT's reference code (FLC777/GLAT, translation_lev_modified.py) anneals the ratio 0.5 -> 0.3 over its
# total_up, 300k updates, the length of its recipe's training; the default of every glancing family but the
# DA-Transformer, whose recipe anneals over 200k (dat.py). Shorter trainings pass their own
# --glance-anneal-updates.
GLAT_ANNEAL_UPDATES = 300_000


def glance_ratio(num_updates: int, start: float = 0.5, end: float = 0.3,
                 anneal_updates: int = GLAT_ANNEAL_UPDATES) -> float:
    """The glancing ratio after ``num_updates``: linear from ``start`` to ``end``, then ``end`` for good."""
    if anneal_updates <= 0:
        return end
    progress = min(max(num_updates, 0) / anneal_updates, 1.0)
    return start + (end - start) * progress


def glance_count(hamming: torch.LongTensor, ratio: float, round_half_up: bool = False) -> torch.LongTensor:
    """How many reference tokens to reveal per sentence: ``floor(hamming * ratio)``, or with ``round_half_up``
    ``floor(hamming * ratio + 0.5)``.

    Each family rounds as its reference code does: GLAT's (FLC777/GLAT, ``glat.py``) takes ``.long()`` of the
    product, rounding down, so a sentence its first pass got right but for one token reveals nothing at
    ratio < 1; the DA-Transformer's ``number-random`` strategy (thu-coai/DA-Transformer, ``nat_dag_loss.py``)
    adds 0.5 first, so at its final ratio 0.1 a Hamming distance of 5 already reveals one token.
    """
    return torch.floor(hamming.to(torch.float64) * ratio + (0.5 if round_half_up else 0.0)).long()


def predicted_tokens(scores: torch.Tensor) -> torch.LongTensor:
    """The first pass's token at each position: the index of the best score over the vocabulary (the last
    dimension), the first one on a tie, as ``argmax``. ``max(-1).indices`` rather than ``argmax(-1)``: on a CPU
    torch's argmax over the last dimension takes about twice as long (docs/results/students, "Where their time
    goes")."""
    return scores.max(-1).indices


def glancing_mask(candidates: torch.BoolTensor, num_glance: torch.LongTensor,
                  generator: torch.Generator = None) -> torch.BoolTensor:
    """Reveal exactly ``min(num_glance[b], candidates[b].sum())`` positions of row b, uniformly among its candidates.

    Every candidate gets a uniform random score and non-candidates a score above all of them; a position is
    revealed when its rank within its row is below the row's count. One sort for the whole batch, so the
    chosen set is a uniform random subset of the candidates of the requested size.
    """
    if candidates.dim() != 2 or num_glance.shape != candidates.shape[:1]:
        raise ValueError(f"glancing_mask: candidates must be [B, T] and num_glance [B], got "
                         f"{tuple(candidates.shape)} and {tuple(num_glance.shape)}")
    scores = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    scores = scores.masked_fill(~candidates, 2.0)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    return candidates & (ranks < num_glance.to(candidates.device).unsqueeze(1))


def add_glancing_args(parser) -> None:
    """The model options of a glancing model (defaults come from its architecture)."""
    parser.add_argument("--glance-start", type=float,
                        help="glancing ratio at update 0 (0 turns glancing off)")
    parser.add_argument("--glance-end", type=float, help="glancing ratio once annealed")
    parser.add_argument("--glance-anneal-updates", type=int,
                        help="updates over which the ratio goes linearly from start to end")


def glancing_defaults(args, start: float, end: float, anneal_updates: int = GLAT_ANNEAL_UPDATES) -> None:
    args.glance_start = getattr(args, "glance_start", start)
    args.glance_end = getattr(args, "glance_end", end)
    args.glance_anneal_updates = getattr(args, "glance_anneal_updates", anneal_updates)


class Glancing:
    """Mixin for a FairseqNATModel with the glancing options: the ratio of the current update.

    fairseq hands the update number to models through ``set_num_updates`` (translation_lev's own train_step
    does not: train with the plugin's ``kd_translation_lev`` task, see fairseq_plugins/tasks.py).
    """

    num_updates = 0

    def set_num_updates(self, num_updates):
        self.num_updates = num_updates
        super().set_num_updates(num_updates)

    def current_glance_ratio(self) -> float:
        """The training ratio of this update; 0 outside training (validation loss and decoding glance at nothing)."""
        if not self.training:
            return 0.0
        return glance_ratio(self.num_updates, self.args.glance_start, self.args.glance_end,
                            self.args.glance_anneal_updates)

    @staticmethod
    def log_glancing(ratio: float, revealed: torch.BoolTensor, candidates: torch.BoolTensor) -> None:
        """fairseq-train's log lines get the ratio of this update and ``glanced``, the share of the positions
        that could be revealed (reference tokens; for CTC, aligned positions) that were: as the model learns,
        its first pass misses less and the share falls below the ratio."""
        count = int(candidates.sum())
        # priority: after the criterion's losses and fairseq's speed and batch figures, where readers look first
        metrics.log_scalar("glance_ratio", ratio, weight=1, priority=250, round=3)
        metrics.log_scalar("glanced", int(revealed.sum()) / max(count, 1), weight=count, priority=250, round=3)


def build_nat_decoder(decoder_class, args, tgt_dict, embed_tokens):
    """``decoder_class(args, tgt_dict, embed_tokens)``, initialised BERT-style when --apply-bert-init asks for
    it, as fairseq's own NAT models build theirs."""
    decoder = decoder_class(args, tgt_dict, embed_tokens)
    if getattr(args, "apply_bert_init", False):
        decoder.apply(init_bert_params)
    return decoder


class GlancingDecoder(NATransformerDecoder):
    """A NAT decoder whose inputs are the source embeddings copied uniformly to the output length, except at
    positions holding a real token (a glanced reference token, or ``<s>``/``</s>`` framing the length): those
    get that token's embedding. Unknown (``<unk>``) positions are the ones to predict.

    The decoder of GLAT, CTC NAT and the DA-Transformer.
    """

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.src_embedding_copy = True  # glancing replaces copied source embeddings: the copy is not optional

    def forward_embedding(self, prev_output_tokens, states=None):
        if states is not None:
            embedded = self.embed_scale * self.embed_tokens(prev_output_tokens)
            if self.project_in_dim is not None:
                embedded = self.project_in_dim(embedded)
            copied = prev_output_tokens.eq(self.unk) | prev_output_tokens.eq(self.padding_idx)
            states = torch.where(copied.unsqueeze(-1), states, embedded)
        return super().forward_embedding(prev_output_tokens, states)

    def forward_copying_source(self, src_embeds, src_masks, tgt_masks):
        """Position t of a row of T positions takes the embedding of real source token floor(t x S / T), S the
        source's real tokens: when T is a multiple of S (the upsampled rows of CTC and the DA-Transformer) each
        source token feeds exactly T / S consecutive positions, which fairseq's rounded steps do not give.
        Counted from the first real source token: fairseq's own mapping counts from column 0, which holds
        padding when sources are left-padded (translation_lev's default), so it would copy padding and never
        reach the last real tokens. Padding positions read column 0."""
        src_lengths, lengths = src_masks.sum(1), tgt_masks.sum(1)
        first = src_masks.long().argmax(1)  # the first True of each row
        position = torch.arange(tgt_masks.size(1), device=tgt_masks.device)
        index = first[:, None] + torch.div(position[None, :] * src_lengths[:, None], lengths[:, None],
                                           rounding_mode="floor")
        index = index.masked_fill(~tgt_masks, 0)
        return src_embeds.gather(1, index[:, :, None].expand(-1, -1, src_embeds.size(-1)))
