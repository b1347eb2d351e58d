"""Model sizes shared by teachers and students, calibrated on the teachers of Zhou, Gu & Neubig (ICLR 2020).

With a shared 40k vocabulary and all embeddings shared, the AT teachers count about 16M, 37M, 65M and 218M
parameters (tests/test_architectures.py checks it); base and big are the usual WMT transformer shapes.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    embed_dim: int
    ffn_dim: int
    layers: int  # encoder and decoder each
    heads: int
    dropout: float

    def apply(self, args) -> None:
        """Fill in every size setting the user did not give on the command line (fairseq's arch convention)."""
        defaults = {
            "encoder_embed_dim": self.embed_dim,
            "encoder_ffn_embed_dim": self.ffn_dim,
            "encoder_layers": self.layers,
            "encoder_attention_heads": self.heads,
            "decoder_embed_dim": self.embed_dim,
            "decoder_ffn_embed_dim": self.ffn_dim,
            "decoder_layers": self.layers,
            "decoder_attention_heads": self.heads,
            "dropout": self.dropout,
            # one joined dictionary (nat_kd.prepare builds it) -> one embedding matrix for all three uses
            "share_all_embeddings": True,
        }
        for key, value in defaults.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)


SIZES = {
    "tiny": ModelSize(embed_dim=256, ffn_dim=1024, layers=3, heads=4, dropout=0.1),
    "small": ModelSize(embed_dim=512, ffn_dim=1024, layers=3, heads=8, dropout=0.1),
    "base": ModelSize(embed_dim=512, ffn_dim=2048, layers=6, heads=8, dropout=0.1),
    "big": ModelSize(embed_dim=1024, ffn_dim=4096, layers=6, heads=16, dropout=0.3),
}


def sized_architecture(size: ModelSize, family_defaults):
    """An architecture function: our size first, then the family's own defaults for everything else."""

    def architecture(args):
        size.apply(args)
        family_defaults(args)

    return architecture
