"""fairseq's EnsembleModel without the per-step work a distillation decode never uses.

SequenceGenerator takes an EnsembleModel instance as its model (fairseq's own alignment generator does the
same). Every number it computes is left as fairseq computes it; this subclass skips only copies and
passes whose results are not needed or are already there:

- ``forward_decoder`` (one model, temperature 1): no in-place division of the logits by 1.0 (a full
  pass over hypotheses x vocabulary each step; x / 1.0 == x), and no attention returned: we never print
  alignments, so the generator's per-step attention buffer copies are skipped too.
- ``reorder_encoder_out``: the rows of one sentence's beams hold the same encoder output, so a reorder that
  keeps every row within its own sentence (the usual case: beams swap places) leaves them unchanged;
  fairseq copies them anyway. Reorders that drop finished sentences or expand the batch are done as usual.

docs/results/generator_speed.md has what this saves.
"""
from __future__ import annotations

import torch
from fairseq.sequence_generator import EnsembleModel


class LeanEnsembleModel(EnsembleModel):
    def __init__(self, models):
        super().__init__(models)
        self.beam = 1
        self._rows = None  # encoder rows as the generator last left them (None: unknown)

    def set_decoder_beam_size(self, beam_size):
        self.beam = beam_size
        super().set_decoder_beam_size(beam_size)

    def forward_encoder(self, net_input):
        self._rows = net_input["src_tokens"].size(0)
        return super().forward_encoder(net_input)

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature: float = 1.0):
        if self.models_size > 1 or temperature != 1.0 or not self.has_incremental_states():
            return super().forward_decoder(tokens, encoder_outs, incremental_states, temperature)
        model = self.single_model
        encoder_out = encoder_outs[0] if self.has_encoder() else None
        decoder_out = model.decoder.forward(tokens, encoder_out=encoder_out, incremental_state=incremental_states[0])
        logits = decoder_out[0][:, -1:, :]
        lprobs = model.get_normalized_probs((logits, decoder_out[1] if len(decoder_out) > 1 else None),
                                            log_probs=True, sample=None)
        return lprobs[:, -1, :], None

    def reorder_encoder_out(self, encoder_outs, new_order):
        rows, self._rows = self._rows, new_order.numel()
        if encoder_outs is not None and rows == new_order.numel() and self._within_sentences(new_order):
            return encoder_outs
        return super().reorder_encoder_out(encoder_outs, new_order)

    def _within_sentences(self, new_order) -> bool:
        own = torch.arange(new_order.numel(), device=new_order.device)
        return bool(torch.equal(torch.div(new_order, self.beam, rounding_mode="trunc"),
                                torch.div(own, self.beam, rounding_mode="trunc")))
