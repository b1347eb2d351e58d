"""fairseq's beam-search step with the same choices and less memory traffic.

fairseq's ``BeamSearch.step`` adds every hypothesis' score to its whole vocabulary row (a new
bsz x beam x V tensor each step) and takes the top 2*beam of the flattened result. A candidate can only
be among those if it is among the top 2*beam of its own row, so here each row's top 2*beam tokens are
taken first and the scores added to those alone. The additions are the same float32 operations, so the
candidates and their scores are the same; only the order among exactly equal scores may differ.
"""
from __future__ import annotations

import torch
from fairseq.search import BeamSearch


class RowTopKBeamSearch(BeamSearch):
    def step(self, step: int, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None,
             candidate_multiple: int = 2):
        bsz, beam_size, vocab_size = lprobs.size()
        k = min(candidate_multiple * beam_size, beam_size * vocab_size - 1)  # fairseq's k (never pad)
        if step == 0 or k > vocab_size:
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)
        row_scores, row_tokens = lprobs.topk(k, dim=-1)  # bsz x beam x k
        cumulative = (row_scores + scores[:, :, step - 1].unsqueeze(-1)).view(bsz, -1)
        cand_scores, position = cumulative.topk(k)
        cand_beams = torch.div(position, k, rounding_mode="trunc")
        cand_tokens = row_tokens.view(bsz, -1).gather(1, position)
        return cand_scores, cand_tokens, cand_beams
