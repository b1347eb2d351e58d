"""Scoring data: why one distilled corpus helps a student more than another (``python -m nat_kd.analyze``).

``align`` is fast_align's model and ``formats`` its file formats; ``tokenizers`` turn raw text into the
tokens every score is computed on; ``metrics`` are complexity, faithfulness, reordering and modes, each a
small class whose score carries the signature of its settings; ``report`` compares the real data with
distilled sets in one table, drawn by ``plotting``.
"""
