"""NAT students ``kd_{family}_{tiny,small,base,big}`` on fairseq's NAT models and the plugin's own.

Each family is trained with fairseq's ``translation_lev`` task (or the plugin's ``kd_translation_lev``) and
``nat_loss`` criterion; what differs is the noise applied to the target during training, the loss and how
many refinement iterations decoding runs. The recommended flags are in STUDENT_FAMILIES (and docs/students.md),
so scripts and docs read them from one place.
"""
from dataclasses import dataclass

from fairseq.models import register_model_architecture
from fairseq.models.nat.cmlm_transformer import cmlm_base_architecture
from fairseq.models.nat.insertion_transformer import insertion_base_architecture
from fairseq.models.nat.iterative_nonautoregressive_transformer import inat_base_architecture
from fairseq.models.nat.levenshtein_transformer import levenshtein_base_architecture
from fairseq.models.nat.nat_crf_transformer import nacrf_base_architecture
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture

from .ctc import ctc_base_architecture, glat_ctc_base_architecture
from .dat import dat_base_architecture
from .glat import glat_base_architecture
from .nacrf import NACRFModel  # noqa: F401  (registers fairseq model "nacrf")
from .sizes import SIZES, sized_architecture


@dataclass(frozen=True)
class StudentFamily:
    fairseq_model: str
    family_defaults: object
    train_flags: tuple  # task/model flags the family needs when training
    decode_flags: tuple  # fairseq-generate flags for its decoding
    # fairseq task to train and decode with; kd_translation_lev (fairseq_plugins/tasks.py) for the families
    # annealing over updates, which translation_lev does not tell the model
    task: str = "translation_lev"
    glancing: bool = False  # takes --glance-start/--glance-end/--glance-anneal-updates (glancing.py)
    # its loss smooths toward the uniform distribution with --label-smoothing; the losses summed over
    # alignments or paths (CTC, DAG) have no one target per position to smooth, and refuse a non-zero value
    label_smoothing: bool = True
    # its loss is a sentence's, over a whole reference: it learns from several a sentence, with these
    # --reference-selection values of --criterion multi_reference_nat_loss (empty: one reference a sentence)
    references: tuple = ()


STUDENT_FAMILIES = {
    # vanilla NAT (Gu et al. 2018): one parallel pass, target length predicted from the encoder
    "nat": StudentFamily(
        "nonautoregressive_transformer", nat_base_architecture,
        ("--noise", "full_mask", "--pred-length-offset", "--length-loss-factor", "0.1"),
        ("--iter-decode-max-iter", "0"),
    ),
    # iterative NAT (Lee et al. 2018): refines its own output, trained with denoising steps
    "inat": StudentFamily(
        "iterative_nonautoregressive_transformer", inat_base_architecture,
        ("--noise", "full_mask", "--pred-length-offset", "--length-loss-factor", "0.1",
         "--train-step", "4", "--dae-ratio", "0.5", "--stochastic-approx"),
        ("--iter-decode-max-iter", "9"),
    ),
    # insertion transformer (Stern et al. 2019): parallel insertions into a growing sequence (uses libnat)
    "inst": StudentFamily(
        "insertion_transformer", insertion_base_architecture,
        ("--noise", "random_delete"),
        ("--iter-decode-max-iter", "9"),
    ),
    # CMLM / Mask-Predict (Ghazvininejad et al. 2019): re-predicts its least confident tokens
    "cmlm": StudentFamily(
        "cmlm_transformer", cmlm_base_architecture,
        ("--noise", "random_mask", "--pred-length-offset", "--length-loss-factor", "0.1"),
        ("--iter-decode-max-iter", "9"),
    ),
    # Levenshtein transformer (Gu et al. 2019): deletion and insertion edits (uses libnat)
    "levt": StudentFamily(
        "levenshtein_transformer", levenshtein_base_architecture,
        ("--noise", "random_delete"),
        ("--iter-decode-max-iter", "9", "--iter-decode-eos-penalty", "0"),
    ),
    # GLAT (Qian et al. 2021): vanilla NAT on copied source embeddings, trained with glancing, one pass
    "glat": StudentFamily(
        "glat", glat_base_architecture,
        ("--noise", "full_mask", "--pred-length-offset", "--length-loss-factor", "0.1"),
        ("--iter-decode-max-iter", "0"),
        task="kd_translation_lev", glancing=True,
    ),
    # CTC NAT (Libovický & Helcl 2018): the source upsampled x2, CTC loss, one pass, no length predictor
    # (the noise is unused: full_mask is the cheapest translation_lev offers)
    "ctc": StudentFamily(
        "ctc_nat", ctc_base_architecture,
        ("--noise", "full_mask"),
        ("--iter-decode-max-iter", "0"),
        label_smoothing=False, references=("ddrs", "per-token-min", "per-token-mean"),
    ),
    # CTC NAT with glancing on its best alignment (Gu & Kong 2021)
    "glat_ctc": StudentFamily(
        "ctc_nat", glat_ctc_base_architecture,
        ("--noise", "full_mask"),
        ("--iter-decode-max-iter", "0"),
        task="kd_translation_lev", glancing=True, label_smoothing=False,
        references=("ddrs", "per-token-min", "per-token-mean"),
    ),
    # NAT-CRF (Sun et al. 2019): vanilla NAT with a low-rank CRF over its outputs, Viterbi in one pass
    "nacrf": StudentFamily(
        "nacrf", nacrf_base_architecture,
        ("--noise", "full_mask", "--pred-length-offset", "--length-loss-factor", "0.1"),
        ("--iter-decode-max-iter", "0"),
    ),
    # DA-Transformer (Huang et al. 2022): a graph of upsample-factor x source-length vertices, trained on all
    # the reference's paths with glancing, one lookahead pass. Factor 4 instead of the paper's 8: the links,
    # their dynamic programmes and the decoder's self-attention grow with L^2 (CPU time), and Multi30k's
    # references fit with room to spare (en-de: at most 2.4x their source's tokens, none left out).
    "dat": StudentFamily(
        "dat", dat_base_architecture,
        ("--noise", "no_noise", "--upsample-factor", "4"),
        ("--iter-decode-max-iter", "0"),
        task="kd_translation_lev", glancing=True, label_smoothing=False,
        references=("per-token-min", "per-token-mean"),
    ),
}

STUDENT_ARCHS = {}  # kd_{family}_{size}: (family, its ModelSize)


def register_architectures(name: str, family: StudentFamily) -> None:
    """fairseq's architectures kd_{name}_{size} of the family, one for each of SIZES."""
    for size_name, size in SIZES.items():
        arch = f"kd_{name}_{size_name}"
        register_model_architecture(family.fairseq_model, arch)(sized_architecture(size, family.family_defaults))
        STUDENT_ARCHS[arch] = (name, size)


def register_student_family(name: str, family: StudentFamily) -> StudentFamily:
    """A student family of your own (docs/extending.md): its kd_{name}_{size} architectures, and its entry in
    STUDENT_FAMILIES, which the study, choose and next_steps read. A name taken is refused."""
    if name in STUDENT_FAMILIES:
        raise ValueError(f"a student family named {name!r} is registered already")
    STUDENT_FAMILIES[name] = family
    register_architectures(name, family)
    return family


for _name, _family in STUDENT_FAMILIES.items():
    register_architectures(_name, _family)
