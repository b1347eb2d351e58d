"""CTC NAT (Libovický & Helcl 2018; Gu & Kong 2021), optionally with glancing, on fairseq's vanilla NAT.

The decoder runs on the source upsampled by ``--upsample-factor`` (the source embeddings copied uniformly to
factor x source length) and predicts a token or a blank at every position; the loss is CTC over all the
alignments of the reference (torch's ``ctc_loss``), so no length predictor is needed. Decoding: one pass,
the argmax at each position, repeats collapsed and blanks dropped.

The blank is ``<s>`` (index 0 of fairseq dictionaries): it never occurs inside a sentence (translation_lev
only prepends it, and the CTC reference leaves it out), so the joined dictionary, and the embedding matrix
every other family shares with the teacher, stay as they are.

Glancing (CTC with GLAT as Gu & Kong combine them, the ``glat_ctc`` family): the first pass's best (Viterbi)
alignment of the reference is its target sequence over the upsampled positions; ``glance_count`` of the
Hamming distance between that and the argmax are revealed at random. As GLAT's loss leaves out what it
revealed, the trained pass's CTC loss counts only the alignments that agree with the revealed labels, and
the revealed positions add neither probability nor gradient (they are pinned to their label).
"""
import torch
import torch.nn.functional as F
from fairseq.models import register_model
from fairseq.models.nat.nonautoregressive_transformer import NATransformerModel
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture

from .glancing import (Glancing, GlancingDecoder, add_glancing_args, glance_count, glancing_defaults, glancing_mask,
                       predicted_tokens)
from .upsampling import UpsampledStudent, collapse_repeats, upsampled_inputs


def ctc_nll(log_probs, input_lengths, targets, target_lengths, blank: int, pinned=None, pinned_tokens=None):
    """Per-sentence CTC negative log-likelihood ([B]) of ``targets`` under ``log_probs`` ([B, T, V]).

    ``pinned`` ([B, T] bool) positions may only emit ``pinned_tokens`` there and add no probability (nor
    gradient): the likelihood of the rest, over the alignments that agree with the pinned labels. A sentence
    no alignment fits (a reference too long for its positions) gets 0, and no gradient.
    """
    if pinned is not None:
        # log P = 0 for the label and -inf for every other token at a pinned position, written into one copy
        # of the [B, T, V] scores (every extra pass over them is a visible share of a glancing CTC update)
        index = pinned_tokens.unsqueeze(-1)
        label_scores = torch.where(pinned.unsqueeze(-1), 0.0, log_probs.gather(2, index))
        # in place on masked_fill's fresh copy: its gradient does not need its output
        log_probs = log_probs.masked_fill(pinned.unsqueeze(-1), float("-inf")).scatter_(2, index, label_scores)
    return F.ctc_loss(log_probs.transpose(0, 1), targets, input_lengths, target_lengths, blank=blank,
                      reduction="none", zero_infinity=True)


def ctc_best_alignment(log_probs, input_lengths, targets, target_lengths, blank: int):
    """The most probable CTC alignment of each target: its label at each position ([B, T], ``blank`` beyond
    the input length) and its log-probability ([B], -inf where no alignment fits).

    Viterbi over the extended label sequence (blank, y1, blank, y2, ..., blank), batched: a loop over the
    positions, each step vectorised over sentences and states, then a batched backtrace.
    """
    batch, length, _ = log_probs.shape
    states = 2 * targets.size(1) + 1
    extended = targets.new_full((batch, states), blank)
    extended[:, 1::2] = targets
    emissions = log_probs.gather(2, extended.unsqueeze(1).expand(batch, length, states))  # [B, T, S]
    # a label may be reached from two states back unless it is a blank or repeats the label before it
    skip = extended.ne(blank)
    skip[:, 2:] &= extended[:, 2:].ne(extended[:, :-2])
    skip[:, :2] = False

    minus_inf = torch.tensor(float("-inf"), dtype=log_probs.dtype, device=log_probs.device)
    score = torch.full((batch, states), float("-inf"), dtype=log_probs.dtype, device=log_probs.device)
    score[:, :2] = emissions[:, 0, :2]
    back = torch.zeros((length, batch, states), dtype=torch.long, device=log_probs.device)
    for t in range(1, length):
        stay = score
        step = F.pad(score, (1, 0), value=float("-inf"))[:, :-1]
        jump = torch.where(skip, F.pad(score, (2, 0), value=float("-inf"))[:, :-2], minus_inf)
        best, offset = torch.stack([stay, step, jump], dim=-1).max(-1)
        active = (t < input_lengths).unsqueeze(1)
        score = torch.where(active, best + emissions[:, t], score)
        back[t] = offset

    last = (2 * target_lengths).unsqueeze(1)
    finals = torch.cat([score.gather(1, last), score.gather(1, (last - 1).clamp(min=0))], dim=1)
    finals[:, 1] = torch.where(target_lengths > 0, finals[:, 1], minus_inf)
    best_score, which = finals.max(1)
    state = last.squeeze(1) - which

    aligned = targets.new_full((batch, length), blank)
    for t in range(length - 1, -1, -1):
        active = t < input_lengths
        aligned[:, t] = torch.where(active, extended.gather(1, state.unsqueeze(1)).squeeze(1), aligned[:, t])
        state = torch.where(active, state - back[t].gather(1, state.unsqueeze(1)).squeeze(1), state)
    return aligned, best_score


def ctc_fits(targets, target_lengths, input_lengths):
    """Whether some CTC alignment of each target fits its positions ([B] bool): its tokens plus a blank between
    each two equal neighbours are no more than the positions. An empty target (a missing reference) does not."""
    repeats = targets[:, 1:].eq(targets[:, :-1])
    repeats &= torch.arange(1, targets.size(1), device=targets.device)[None, :] < target_lengths[:, None]
    return (target_lengths > 0) & (target_lengths + repeats.sum(1) <= input_lengths)


def ctc_alignment_accuracy(log_probs, input_lengths, targets, target_lengths, blank: int):
    """Selective KD's evaluator score ([B]): the share of a sentence's positions whose argmax is the label
    (token or blank) of the target's best alignment under ``log_probs``, as NJUNLP/SelectiveKD's
    ``compute_acc``; 0 where no alignment fits the target (the evaluator cannot produce it at all)."""
    aligned, score = ctc_best_alignment(log_probs, input_lengths, targets, target_lengths, blank)
    positions = torch.arange(log_probs.size(1), device=log_probs.device)[None, :] < input_lengths[:, None]
    agree = (predicted_tokens(log_probs).eq(aligned) & positions).sum(1)
    return torch.where(torch.isfinite(score), agree / input_lengths.clamp(min=1), 0.0)


def ctc_fit(log_probs, input_lengths, targets, target_lengths, blank: int):
    """How well each target fits a pass's output: its CTC loss per target token ([B]), inf where no alignment
    fits it (ctc_nll's 0 for those would make them look the best)."""
    nll = F.ctc_loss(log_probs.transpose(0, 1), targets, input_lengths, target_lengths, blank=blank,
                     reduction="none", zero_infinity=False)
    return nll / target_lengths.clamp(min=1)


def select_references(framed: list[tuple], chosen, pad: int):
    """Row b of the ``chosen[b]``-th of the (targets [B, T_k], lengths [B]) pairs: one target a sentence, padded
    to the longest chosen."""
    width = max(targets.size(1) for targets, _ in framed)
    stacked = torch.stack([F.pad(targets, (0, width - targets.size(1)), value=pad) for targets, _ in framed], 1)
    lengths = torch.stack([lengths for _, lengths in framed], 1)
    rows = torch.arange(stacked.size(0), device=stacked.device)
    targets, target_lengths = stacked[rows, chosen], lengths[rows, chosen]
    return targets[:, :max(int(target_lengths.max()), 1)], target_lengths


class CTCDecoder(GlancingDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.embed_length = None  # the output length is factor x source length: no length predictor


@register_model("ctc_nat")
class CTCNATModel(UpsampledStudent, Glancing, NATransformerModel):
    decoder_class, model_name = CTCDecoder, "ctc_nat (CTC NAT)"

    @property
    def allow_length_beam(self):
        return False  # the output length is fixed by the source length

    @staticmethod
    def add_args(parser):
        NATransformerModel.add_args(parser)
        add_glancing_args(parser)
        parser.add_argument("--upsample-factor", type=int,
                            help="decoder positions per source token (2: see docs/students.md)")

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, **kwargs)
        inputs, input_lengths = self._inputs(src_tokens)
        targets, target_lengths = self._targets(tgt_tokens)
        nll = self._trained_nll(encoder_out, inputs, input_lengths, targets, target_lengths)
        # per reference token (as nat_loss averages its token losses), then per sentence: torch's "mean"
        return {"ctc": {"loss": (nll / target_lengths.clamp(min=1)).mean(), "factor": 1.0}}

    def forward_references(self, src_tokens, src_lengths, references, selection: str):
        """The per-token losses over several references per sentence (``references`` [B, K, T], each framed
        <s> ... </s>, all padding where a line has fewer): with ``selection`` "min", each sentence is trained on
        the reference its first pass gives the lowest CTC loss per token (not DDRS's choice, which compares the
        summed losses: ``reference_nll``; a reference no alignment fits is never chosen), glancing at that
        reference; with "mean", on every reference, each with its own glancing, the per-token losses averaged.
        Without glancing, "min" is the per-sentence minimum of the single-reference losses, each as ``forward``
        computes it."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        inputs, input_lengths = self._inputs(src_tokens)
        framed = [self._targets(references[:, k]) for k in range(references.size(1))]
        present = torch.stack([lengths > 0 for _, lengths in framed], 1)  # [B, K]
        if selection == "mean":
            per_token = torch.stack([self._trained_nll(encoder_out, inputs, input_lengths, targets, lengths)
                                     / lengths.clamp(min=1) for targets, lengths in framed], 1)
            loss = (per_token * present).sum(1) / present.sum(1).clamp(min=1)
            return {"ctc": {"loss": loss.mean(), "factor": 1.0}}
        if selection != "min":
            raise ValueError(f"reference selection {selection!r}: 'min' or 'mean'")
        glancing = self.current_glance_ratio() > 0
        with torch.set_grad_enabled(torch.is_grad_enabled() and not glancing):
            # without glancing this pass is the trained one: the loss is the best-fitting reference's
            log_probs = F.log_softmax(self.decoder(normalize=False, prev_output_tokens=inputs,
                                                   encoder_out=encoder_out).float(), -1)
        with torch.no_grad():  # a reference no alignment fits is never the best (ctc_nll's 0 for it would be)
            fits = torch.stack([ctc_fit(log_probs, input_lengths, targets, lengths, self.bos)
                                for targets, lengths in framed], 1).masked_fill(~present, float("inf"))
        chosen = fits.argmin(1)
        if not glancing:
            nll = torch.stack([ctc_nll(log_probs, input_lengths, targets, lengths, self.bos) / lengths.clamp(min=1)
                               for targets, lengths in framed], 1)
            return {"ctc": {"loss": nll.gather(1, chosen.unsqueeze(1)).mean(), "factor": 1.0}}
        targets, target_lengths = select_references(framed, chosen, self.pad)
        nll = self._trained_nll(encoder_out, inputs, input_lengths, targets, target_lengths, log_probs)
        return {"ctc": {"loss": (nll / target_lengths.clamp(min=1)).mean(), "factor": 1.0}}

    def reference_nll(self, src_tokens, src_lengths, references):
        """DDRS's inputs (criterions/multi_reference.py): each sentence's CTC loss summed over its tokens against
        each of its references ([B, K]; 0 where none fits), the references' lengths ([B, K]) and whether an
        alignment fits each ([B, K]; a missing reference does not). Without glancing one pass scores them all;
        with it, each reference is glanced at, from one shared first pass, on a trained pass of its own."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        inputs, input_lengths = self._inputs(src_tokens)
        framed = [self._targets(references[:, k]) for k in range(references.size(1))]
        glancing = self.current_glance_ratio() > 0
        with torch.set_grad_enabled(torch.is_grad_enabled() and not glancing):
            log_probs = F.log_softmax(self.decoder(normalize=False, prev_output_tokens=inputs,
                                                   encoder_out=encoder_out).float(), -1)
        if glancing:
            nll = [self._trained_nll(encoder_out, inputs, input_lengths, targets, lengths, log_probs)
                   for targets, lengths in framed]
        else:
            nll = [ctc_nll(log_probs, input_lengths, targets, lengths, self.bos) for targets, lengths in framed]
        fits = [ctc_fits(targets, lengths, input_lengths) for targets, lengths in framed]
        return torch.stack(nll, 1), torch.stack([lengths for _, lengths in framed], 1), torch.stack(fits, 1)

    def alignment_accuracy(self, src_tokens, src_lengths, tgt_tokens):
        """Selective KD's evaluator score of each sentence on ``tgt_tokens`` (framed <s> ... </s>), from one
        pass without glancing (``ctc_alignment_accuracy``)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        inputs, input_lengths = self._inputs(src_tokens)
        targets, target_lengths = self._targets(tgt_tokens)
        log_probs = F.log_softmax(self.decoder(normalize=False, prev_output_tokens=inputs,
                                               encoder_out=encoder_out).float(), -1)
        return ctc_alignment_accuracy(log_probs, input_lengths, targets, target_lengths, self.bos)

    def _inputs(self, src_tokens):
        inputs = upsampled_inputs(src_tokens, self.args.upsample_factor, self.unk, self.pad)
        return inputs, inputs.ne(self.pad).sum(1)

    def _targets(self, tgt_tokens):
        """The reference without its <s> ... </s> frame, and its lengths."""
        targets = tgt_tokens[:, 1:].masked_fill(tgt_tokens[:, 1:].eq(self.eos), self.pad)
        return targets, targets.ne(self.pad).sum(1)

    def _trained_nll(self, encoder_out, inputs, input_lengths, targets, target_lengths, first_pass=None):
        """The trained pass's per-sentence CTC loss of ``targets``, glancing at them (``first_pass``: the
        untrained-on pass's log-probabilities, when the caller has them already)."""
        glanced, aligned = self.glance(inputs, input_lengths, targets, target_lengths, encoder_out, first_pass)
        if glanced is not None:
            inputs = torch.where(glanced, aligned, inputs)
        logits = self.decoder(normalize=False, prev_output_tokens=inputs, encoder_out=encoder_out)
        return ctc_nll(F.log_softmax(logits.float(), -1), input_lengths, targets, target_lengths, self.bos,
                       glanced, aligned)

    def glance(self, inputs, input_lengths, targets, target_lengths, encoder_out, log_probs=None):
        """Positions revealed to the trained pass and the aligned labels revealed there (None, None outside
        training); ``log_probs``: the first pass's, if computed already."""
        ratio = self.current_glance_ratio()
        if ratio <= 0:
            return None, None
        with torch.no_grad():
            if log_probs is None:
                log_probs = F.log_softmax(
                    self.decoder(normalize=False, prev_output_tokens=inputs, encoder_out=encoder_out).float(), -1)
            aligned, score = ctc_best_alignment(log_probs, input_lengths, targets, target_lengths, self.bos)
            candidates = inputs.ne(self.pad) & torch.isfinite(score).unsqueeze(1)
            hamming = (predicted_tokens(log_probs).ne(aligned) & candidates).sum(1)
            revealed = glancing_mask(candidates, glance_count(hamming, ratio))
            self.log_glancing(ratio, revealed, candidates)
            return revealed, aligned

    def forward_decoder(self, decoder_out, encoder_out, decoding_format=None, **kwargs):
        if decoder_out.step > 0:
            return decoder_out  # one pass is final: a refinement step changes nothing, the generator stops
        inputs = decoder_out.output_tokens
        scores, best = self.decoder(normalize=True, prev_output_tokens=inputs, encoder_out=encoder_out).max(-1)
        best = best.masked_fill(inputs.eq(self.pad), self.pad)
        scores = scores.float().masked_fill(inputs.eq(self.pad), 0)
        tokens, token_scores, lengths = collapse_repeats(best, scores, self.pad, blank=self.bos)
        # framed <s> ... </s> as every NAT output; the frame is scored with the path's mean log-probability
        # per position, so an output of blanks alone still says how sure the model was
        path_score = (scores.sum(1) / inputs.ne(self.pad).sum(1)).unsqueeze(1)
        frame = tokens.new_full((tokens.size(0), 1), self.pad)
        output_tokens = torch.cat([frame.fill_(self.bos), tokens, frame.clone().fill_(self.pad)], 1)
        output_tokens.scatter_(1, (lengths + 1).unsqueeze(1), self.eos)
        output_scores = torch.cat([path_score, token_scores, torch.zeros_like(path_score)], 1)
        output_scores = output_scores.scatter(1, (lengths + 1).unsqueeze(1), path_score).type_as(
            decoder_out.output_scores)
        history = decoder_out.history
        if history is not None:
            history.append(output_tokens.clone())
        return decoder_out._replace(output_tokens=output_tokens, output_scores=output_scores, attn=None,
                                    history=history)


def _ctc_defaults(args):
    args.upsample_factor = getattr(args, "upsample_factor", 2)
    nat_base_architecture(args)


def ctc_base_architecture(args):
    glancing_defaults(args, start=0.0, end=0.0)
    _ctc_defaults(args)


def glat_ctc_base_architecture(args):
    glancing_defaults(args, start=0.5, end=0.3)
    _ctc_defaults(args)
