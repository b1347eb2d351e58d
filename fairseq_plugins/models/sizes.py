"""Model sizes shared by teachers and students, calibrated on the teachers of Zhou, Gu & Neubig (ICLR 2020).

With a shared 40k vocabulary and all embeddings shared, the AT teachers count about 16M, 37M, 65M and 218M
parameters (tests/test_architectures.py checks it); base and big are the usual WMT transformer shapes.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    """A transformer's dimensions, the encoder's and the decoder's alike: an architecture's own (SIZES), or the
    sizes a command line, a study's config or a benchmark gives a model of any architecture."""
    embed_dim: int
    ffn_dim: int
    layers: int  # encoder and decoder each
    heads: int
    dropout: float = 0.1

    def overrides(self) -> dict:
        """These sizes as fairseq argument names (to build the model in-process, e.g. to count it)."""
        out = {"dropout": self.dropout}
        for side in ("encoder", "decoder"):
            out |= {f"{side}_embed_dim": self.embed_dim, f"{side}_ffn_embed_dim": self.ffn_dim,
                    f"{side}_layers": self.layers, f"{side}_attention_heads": self.heads}
        return out

    def flags(self) -> list[str]:
        """These sizes as fairseq-train options (--encoder-embed-dim 256 ...), over an architecture's own."""
        return [str(x) for key, value in self.overrides().items() for x in (f"--{key.replace('_', '-')}", value)]

    def apply(self, args) -> None:
        """Fill in every size setting the user did not give on the command line (fairseq's arch convention)."""
        defaults = {**self.overrides(),
                    # one joined dictionary (nat_kd.prepare builds it) -> one embedding matrix for all three uses
                    "share_all_embeddings": True}
        for key, value in defaults.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)

    @property
    def label(self) -> str:
        return f"{self.layers}x{self.embed_dim}"

    @classmethod
    def parse(cls, label: str) -> "ModelSize":
        """'6x512' -> 6 layers of width 512, a feed-forward 4x as wide, a head every 64 dimensions (4 at most
        below 256: the studies' 2x128 students have 4), as transformer-base and the studies size them."""
        try:
            layers, width = (int(x) for x in label.split("x"))
        except ValueError:
            raise ValueError(f"{label}: write LAYERSxWIDTH, e.g. 2x128 or 6x512") from None
        heads = max(4, width // 64)
        if layers < 1 or width < 4 or width % heads:
            raise ValueError(f"{label}: at least 1 layer, and a width that its {heads} heads divide")
        return cls(embed_dim=width, ffn_dim=4 * width, layers=layers, heads=heads)


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
