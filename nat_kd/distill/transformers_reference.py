"""transformers' own ``generate`` on a Hugging Face teacher: the reference that ``--check-against-transformers``
compares the ctranslate2 backend with (agreement.py). A decoder (backends.base.Decoder), not a backend:
CTranslate2 decodes these teachers faster, so ``--backend`` never chooses it.

The same source tokens (the teacher tokenizer's, EOS included), the same beam size, length penalty and
length limit, the n-best when the strategy reranks it. The limit is fairseq's: at most --max-len-b tokens,
then EOS is forced (CTranslate2 stops there without it: the same tokens); a multilingual teacher's target
language token is forced first and not counted. That token is the one transformers' documentation forces
(M2M100: ``tokenizer.get_lang_id(code)``; NLLB: the code's id), read here from the tokenizer and never from
the teacher's target prefix, so that a wrong prefix shows as disagreement. Beam search stops as fairseq's and
CTranslate2's do, once the beam has its finished hypotheses (``early_stopping=True``).
"""
from __future__ import annotations

import math

from nat_kd.errors import SettingsError

from .backends.base import BackendInputs, BackendSettings, Decoded, Decoder, Hypothesis
from .decoding import build_strategy
from .source import token_strings

SAMPLING_STRATEGIES = ("sampling", "topk", "topp")


class TransformersReference(Decoder):

    @staticmethod
    def check(settings: BackendSettings, teacher) -> None:
        """Refuse, before anything is decoded, what it cannot compare."""
        if settings.decoding.strategy in SAMPLING_STRATEGIES:
            raise SettingsError(f"--check-against-transformers compares searches, not samples: it needs --strategy "
                                f"beam, greedy or seq-inter, not {settings.decoding.strategy}")
        if getattr(teacher, "kind", None) != "transformers":
            raise SettingsError("--check-against-transformers needs a Hugging Face teacher folder (--teacher-path)")

    def __init__(self, settings: BackendSettings, inputs: BackendInputs, threads: int = 1):
        import torch
        from transformers import AutoModelForSeq2SeqLM

        strategy, teacher = build_strategy(settings.decoding), inputs.teacher
        self.check(settings, teacher)
        torch.set_num_threads(threads)
        self.torch, self.tokenizer = torch, teacher.tokenizer
        # the output ids named as CTranslate2 names them: the tokenizer calls M2M100's made-up words <unk>
        self.target_vocabulary = teacher.target_vocabulary
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(teacher.path)).eval()
        self.src_dict, self.source_tokens, self.eos = teacher.src_dict, inputs.source_tokens, teacher.eos
        self.nbest = strategy.beam_size if strategy.needs_reference else 1
        prefix = teacher.target_prefix
        self.skip = 1 + len(prefix)  # the decoder's start token and the forced target language token
        s = settings.decoding
        self.options = dict(num_beams=strategy.beam_size, num_return_sequences=self.nbest, length_penalty=s.lenpen,
                            do_sample=False, early_stopping=True,
                            max_new_tokens=min(s.max_len_b, teacher.max_positions[1] - 1) + 1 + len(prefix),
                            forced_eos_token_id=self.tokenizer.eos_token_id, min_new_tokens=1 + len(prefix),
                            output_scores=True, return_dict_in_generate=True)
        if teacher.multilingual:
            code = teacher.codes[1]
            self.options["forced_bos_token_id"] = self.tokenizer.get_lang_id(code) \
                if hasattr(self.tokenizer, "get_lang_id") else self.tokenizer.convert_tokens_to_ids(code)

    def disagreement_causes(self, teacher) -> list[str]:
        """What usually makes CTranslate2 decode a Hugging Face model otherwise than transformers does, each with
        what this model and tokenizer show of it."""
        tokenizer, config = self.tokenizer, self.model.config
        causes = []
        if teacher.model_type == "marian":
            start = self.model.get_decoder().embed_tokens.weight[config.decoder_start_token_id]
            causes.append(f"a non-zero <pad> embedding: CTranslate2 starts MarianMT's decoder from zeros, transformers "
                          f"from the embedding of {tokenizer.convert_ids_to_tokens(config.decoder_start_token_id)} "
                          f"(this model's is {'non-zero' if bool(start.any()) else 'zero'})")
        causes.append(f"a tokenizer that is not the model's ({type(tokenizer).__name__} from the files in "
                      f"{teacher.path}: they must be those the model was trained with)")
        if teacher.multilingual:
            forced = tokenizer.convert_ids_to_tokens(self.options["forced_bos_token_id"])
            causes.append(f"the language tokens (--teacher-src-lang, --teacher-tgt-lang): CTranslate2 started from "
                          f"{teacher.target_prefix[0]}, transformers from {forced}")
        return causes

    def decode(self, ids: list[int]) -> Decoded:
        torch, tokenizer = self.torch, self.tokenizer
        sources = [tokenizer.convert_tokens_to_ids(line.split() + [self.eos])
                   for line in token_strings(self.src_dict, [self.source_tokens[i] for i in ids])]
        width = max(map(len, sources))
        input_ids = torch.full((len(sources), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, source in enumerate(sources):
            input_ids[row, :len(source)], mask[row, :len(source)] = torch.tensor(source), 1
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, **self.options)
        scores = out.sequences_scores.tolist() if getattr(out, "sequences_scores", None) is not None \
            else [math.nan] * len(out.sequences)
        specials = {tokenizer.eos_token_id, tokenizer.pad_token_id}
        hypotheses = []
        for sequence, score in zip(out.sequences.tolist(), scores):
            generated = sequence[self.skip:]
            end = next((k for k, t in enumerate(generated) if t in specials), len(generated))
            hypotheses.append(Hypothesis(" ".join(self.target_vocabulary[t] for t in generated[:end]), score))
        return [(sentence_id, hypotheses[k * self.nbest:(k + 1) * self.nbest]) for k, sentence_id in enumerate(ids)]
