"""``--max-tokens auto``: the fairseq backend's batches sized to the GPU's free memory.

A bound on what fairseq 0.12's SequenceGenerator holds on the GPU for one batch of a transformer teacher (or
an ensemble of them), in bytes. k is the beam (hypotheses per sentence), e the bytes of an activation (4; 2
with --fp16), V the target vocabulary, T the longest output fairseq allows (a * the longest source + b, at most
the decoder's positions - 1); each model has L decoder layers whose self-attention is d wide and whose
encoder-decoder attention is c wide, and an encoder output D wide:

    A (per hypothesis)           = sum over the models of [2 (L + 1) d (T + 1) e + V (e + 8)] + 24 V + 12 (T + 2)
    C (per hypothesis and token) = sum over the models of [2 L c e + 2 D e + 9] + 4 (T + 2)

A: the self-attention keys and values cached for the T + 1 steps (one layer more: each step's concatenation copies a
layer's), the logits and their float32 log-probabilities, the search's float32 copies of them (scores added,
top-k or sort), and the tokens (int64) and scores (float32) buffers. C: the encoder-decoder keys and values
cached, the encoder's output and embeddings copied to every beam, its padding mask and source tokens, and the
float32 attention buffer (source x output). B sentences of at most S tokens then decode in at most
B k (A + S C). Encoding comes first and frees its intermediates before decoding starts; per source token it
needs at most E = the largest over the models of (2 F + 4 D) e + (4 + 2 e) H S_max (a feed-forward layer F
wide, the residuals, the attention scores of H heads over the longest source, in e and in float32).

The budget, per decoding process: SAFETY (a half) of the free memory torch.cuda.mem_get_info reports with the
teacher on the GPU, after taking off, for --workers N > 1, the N processes' own teachers and CUDA contexts
(CONTEXT_BYTES each), divided by N. The half leaves room for what the bound leaves out: the allocator's
fragmentation, cuBLAS's workspace, and the copies fairseq makes while it reorders the cache.

The limits: max_sentences = budget // (k (A + n C)) and max_tokens = max_sentences * n, n the median length
of the corpus's sentences (the tokens each counts for in a batch), so that a batch of median-length sentences
fills the budget. Any batch within both limits (B <= max_sentences, B S <= max_tokens) needs at most
max_sentences k A + max_tokens k C <= budget. max_tokens is lowered to budget // E where encoding needs more;
an explicit --max-sentences lowers max_sentences.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nat_kd.errors import SettingsError

AUTO = "auto"
# --max-tokens left out: fairseq-generate's own on the CPU, where bigger batches gain little; on a GPU the batches
# that decoded fastest, with the same hypotheses (docs/results/gpu/README.md)
CPU_MAX_TOKENS = 12000
GPU_MAX_TOKENS = 32000
SAFETY = 0.5
CONTEXT_BYTES = 1 << 30  # a CUDA context, cuBLAS's handles and torch's own, per extra process: an upper guess
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryDims:
    """The dimensions the memory bound reads of one transformer: decoder layers and widths, encoder width,
    feed-forward width and heads of its encoder, and its output vocabulary (a model's size as the plugins name
    it is fairseq_plugins' ModelSize)."""

    decoder_layers: int
    self_attention: int  # d
    cross_attention: int  # c
    encoder_output: int  # D
    encoder_ffn: int  # F
    encoder_heads: int  # H
    vocabulary: int  # V


def memory_dims(model, path: str = "teacher") -> MemoryDims:
    """The memory dimensions of a fairseq encoder-decoder transformer; a SettingsError for a model without one."""
    try:
        decoder, encoder = model.decoder, model.encoder
        first, last = decoder.layers[0], encoder.layers[-1]
        projection = getattr(decoder, "output_projection", None)
        vocabulary = max(len(decoder.dictionary), getattr(projection, "out_features", 0) or 0)
        return MemoryDims(decoder_layers=len(decoder.layers), self_attention=first.self_attn.embed_dim,
                          cross_attention=first.encoder_attn.embed_dim, encoder_output=last.embed_dim,
                          encoder_ffn=last.fc1.out_features, encoder_heads=last.self_attn.num_heads,
                          vocabulary=vocabulary)
    except (AttributeError, IndexError, TypeError):
        raise SettingsError(f"--max-tokens auto bounds the memory of fairseq transformer teachers; {path} is a "
                            f"{type(model).__name__}: give --max-tokens a number") from None


@dataclass(frozen=True)
class AutoBatching:
    max_tokens: int
    max_sentences: int
    record: dict  # meta.json's batching.auto: the inputs and terms of the formula


def per_hypothesis(shapes: list[MemoryDims], e: int, longest_output: int) -> tuple[int, int]:
    """(A, C) of the module's formula, in bytes."""
    t = longest_output
    a = sum(2 * (s.decoder_layers + 1) * s.self_attention * (t + 1) * e + s.vocabulary * (e + 8) for s in shapes)
    vocabulary = max(s.vocabulary for s in shapes)
    a += 24 * vocabulary + 12 * (t + 2)
    c = sum(2 * s.decoder_layers * s.cross_attention * e + 2 * s.encoder_output * e + 9 for s in shapes)
    return a, c + 4 * (t + 2)


def encoding_bytes(shapes: list[MemoryDims], e: int, longest_source: int) -> int:
    """E of the module's formula: bytes per source token while the encoder runs."""
    return max((2 * s.encoder_ffn + 4 * s.encoder_output) * e + (4 + 2 * e) * s.encoder_heads * longest_source
               for s in shapes)


def size_batches(*, free: int, total: int, teacher_bytes: int, processes: int, shapes: list[MemoryDims],
                 beam: int, fp16: bool, longest_output: int, longest_source: int, sizes: np.ndarray,
                 max_sentences: int | None, device: str) -> AutoBatching:
    """The module's limits for a corpus whose sentences count ``sizes`` tokens each in a batch."""
    e = 2 if fp16 else 4
    extra = processes if processes > 1 else 0  # the main process keeps its teacher; N workers load N more
    usable = free - extra * (teacher_bytes + CONTEXT_BYTES)
    budget = int(SAFETY * usable / processes)
    a, c = per_hypothesis(shapes, e, longest_output)
    encoding = encoding_bytes(shapes, e, longest_source)
    median = max(1, int(np.median(sizes)))
    longest = int(sizes.max())
    sentences = budget // (beam * (a + median * c)) if budget > 0 else 0
    if max_sentences is not None:
        sentences = min(sentences, max_sentences)
    tokens = min(sentences * median, budget // encoding) if budget > 0 else 0
    if sentences < 1 or tokens < longest:
        workers = f" shared by {processes} processes (--workers)" if processes > 1 else ""
        raise SettingsError(
            f"--max-tokens auto: {free / GIB:.2f} GiB free on {device}{workers} hold batches of {max(0, tokens)} "
            f"tokens at beam {beam}, fewer than the longest sentence's {longest}: give --max-tokens {longest} or "
            "more, or free the GPU, use fewer --workers, a smaller --beam or --max-len-b")
    record = {"requested": AUTO, "device": device, "free_bytes": free, "total_bytes": total,
              "teacher_bytes": teacher_bytes, "processes": processes, "safety": SAFETY,
              "context_bytes": CONTEXT_BYTES, "budget_bytes": budget, "beam": beam, "bytes_per_activation": e,
              "longest_output": longest_output, "longest_source": longest_source, "median_tokens": median,
              "per_hypothesis_bytes": a, "per_hypothesis_source_token_bytes": c,
              "encoding_bytes_per_token": encoding, "max_sentences_given": max_sentences,
              "formula": "nat_kd/distill/autobatch.py"}
    return AutoBatching(int(tokens), int(sentences), record)


def auto_batching(loaded, device: str, processes: int) -> AutoBatching:
    """--max-tokens auto for this loaded's teacher and corpus on ``device``, its teacher already there."""
    import torch

    cfg, teacher = loaded.cfg, loaded.teacher
    free, total = torch.cuda.mem_get_info(torch.device(device))
    shapes = [memory_dims(m, p) for m, p in zip(teacher.models, teacher.paths)]
    teacher_bytes = sum(t.numel() * t.element_size() for m in teacher.models
                        for t in [*m.parameters(), *m.buffers()])
    sources = np.array([len(t) for t in loaded.corpus.source_tokens])
    sizes = loaded.dataset.num_tokens_vec(np.arange(len(sources)))
    d = cfg.decoding
    longest_output = min(int(d.max_len_a * int(sources.max()) + d.max_len_b), teacher.max_positions[1] - 1)
    return size_batches(free=int(free), total=int(total), teacher_bytes=int(teacher_bytes), processes=processes,
                        shapes=shapes, beam=loaded.strategy.beam_size, fp16=cfg.fp16,
                        longest_output=longest_output, longest_source=int(sources.max()), sizes=sizes,
                        max_sentences=cfg.max_sentences, device=device)
