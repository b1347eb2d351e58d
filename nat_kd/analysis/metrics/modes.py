"""Multi-modality diagnostic of the study's toy experiment (Zhou, Gu & Neubig 2020, section 3).

Given unigram models p(y|l) for K output languages (modes) and a prior p(l), each output sentence
y = y_1..y_T gets a language posterior
    p(l|y) ~ (1/T) sum_t p(y_t|l) p(l) / sum_k p(y_t|k) p(k).
Tokens unknown to every language carry no evidence and are left out of the average (T counts the
others); a sentence with no known token has no posterior (NaN) and is counted in ``unknown``.
Purity of a sentence is max_l p(l|y); the corpus mix is the mean posterior and the share of sentences
whose argmax is each language.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from nat_kd.analysis.metrics.base import MODES, REPORT, Column, Measure, MeasuredSet, Signature
from nat_kd.corpus import read_lines


class UnigramModels:
    """Maximum-likelihood unigram distributions p(y|l) over one shared vocabulary."""

    def __init__(self, languages: list[str], vocab: list[str], probs: np.ndarray, prior: np.ndarray):
        self.languages, self.vocab, self.probs, self.prior = languages, vocab, probs, prior
        self.index = {w: i for i, w in enumerate(vocab)}

    @classmethod
    def from_texts(cls, texts: dict[str, list[str]], prior: dict[str, float] | None = None) -> "UnigramModels":
        """``texts``: language -> tokenised lines. ``prior`` defaults to uniform."""
        languages = list(texts)
        tokens = {lang: list(itertools.chain.from_iterable(line.split() for line in lines))
                  for lang, lines in texts.items()}
        vocab = list(dict.fromkeys(itertools.chain.from_iterable(tokens.values())))
        index = {w: i for i, w in enumerate(vocab)}
        probs = np.zeros((len(vocab), len(languages)))
        for k, lang in enumerate(languages):
            ids = np.fromiter(map(index.__getitem__, tokens[lang]), dtype=np.int64, count=len(tokens[lang]))
            counts = np.bincount(ids, minlength=len(vocab)).astype(np.float64)
            probs[:, k] = counts / max(counts.sum(), 1.0)
        p = np.array([(prior or {}).get(lang, 1.0) for lang in languages], dtype=np.float64)
        return cls(languages, vocab, probs, p / p.sum())

    def token_posteriors(self, token_ids: np.ndarray) -> np.ndarray:
        """p(l | y_t) for each known token id: shape (tokens, languages)."""
        joint = self.probs[token_ids] * self.prior
        return joint / joint.sum(axis=1, keepdims=True)


@dataclass
class ModesScore:
    languages: list[str]
    posteriors: np.ndarray   # (sentences, languages), NaN rows for sentences with no known token
    unknown: int
    signature: Signature

    @property
    def purity(self) -> np.ndarray:
        return self.posteriors.max(axis=1)

    @property
    def mean_purity(self) -> float:
        return float(np.nanmean(self.purity)) if len(self.posteriors) > self.unknown else float("nan")

    @property
    def mix(self) -> dict[str, float]:
        """Mean posterior of each language over the sentences that have one (NaN when none has)."""
        if len(self.posteriors) == self.unknown:
            return {lang: float("nan") for lang in self.languages}
        return dict(zip(self.languages, np.nanmean(self.posteriors, axis=0).tolist()))

    @property
    def argmax_share(self) -> dict[str, float]:
        valid = ~np.isnan(self.posteriors[:, 0])
        winners = np.bincount(self.posteriors[valid].argmax(axis=1), minlength=len(self.languages))
        return dict(zip(self.languages, (winners / max(valid.sum(), 1)).tolist()))

    def format(self) -> str:
        mix = ", ".join(f"{k}={v:.3f}" for k, v in self.mix.items())
        return f"purity = {self.mean_purity:.4f}; mix: {mix}; {self.unknown} sentences without known tokens | " \
               f"{self.signature}"


class Modes:
    """Language posteriors of output sentences under per-language unigram models."""

    def __init__(self, models: UnigramModels):
        self.models = models

    def corpus_score(self, outputs: list[str], settings: dict | None = None) -> ModesScore:
        """``outputs``: tokenised sentences (tokenised like the model's texts)."""
        token_lists = [line.split() for line in outputs]
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        flat = list(itertools.chain.from_iterable(token_lists))
        ids = np.fromiter(map(self.models.index.get, flat, itertools.repeat(-1)), dtype=np.int64, count=len(flat))
        sentence = np.repeat(np.arange(len(outputs)), lengths)
        known = ids >= 0
        known &= self.models.probs[np.where(known, ids, 0)].sum(axis=1) > 0
        post = self.models.token_posteriors(ids[known])
        n_known = np.bincount(sentence[known], minlength=len(outputs))
        sums = np.stack([np.bincount(sentence[known], post[:, k], minlength=len(outputs))
                         for k in range(post.shape[1])], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            posteriors = sums / n_known[:, None]
        prior = ",".join(f"{lang}={p:.3g}" for lang, p in zip(self.models.languages, self.models.prior))
        signature = Signature("modes", {**(settings or {}), "prior": prior})
        return ModesScore(self.models.languages, posteriors, int((n_known == 0).sum()), signature)


def mode_score(data: MeasuredSet) -> ModesScore:
    """The language posteriors of the set's targets, tokenised as the aligner saw them."""
    return Modes(data.settings.modes).corpus_score(data.settings.tokenizer.corpus(read_lines(data.tgt)))


class ModePurity(Measure):
    """The mean purity of the set's targets: how surely each is in one language."""

    name, label, format, needs = "mode_purity", "purity", ".3f", MODES
    tables = {REPORT: Column()}

    def corpus_score(self, data: MeasuredSet) -> float:
        return data.once(mode_score).mean_purity


class ModeMix(Measure):
    """The mean posterior of each language over the set's targets."""

    name, label, needs = "mode_mix", "mode mix", MODES

    def corpus_score(self, data: MeasuredSet) -> dict[str, float]:
        return data.once(mode_score).mix


class ModeUnknown(Measure):
    """The set's targets with no token any language's unigram model knows."""

    name, label, needs = "mode_unknown", "targets in no language", MODES

    def corpus_score(self, data: MeasuredSet) -> int:
        return data.once(mode_score).unknown
