"""NAT students ``kd_{nat,inat,inst,cmlm,levt}_{tiny,small,base,big}`` on fairseq's own NAT models.

Each family is trained with fairseq's ``translation_lev`` task and ``nat_loss`` criterion; what differs is
the noise applied to the target during training and how many refinement iterations decoding runs. The
recommended flags are in STUDENT_FAMILIES (and the README), so scripts and docs read them from one place.
"""
from dataclasses import dataclass

from fairseq.models import register_model_architecture
from fairseq.models.nat.cmlm_transformer import cmlm_base_architecture
from fairseq.models.nat.insertion_transformer import insertion_base_architecture
from fairseq.models.nat.iterative_nonautoregressive_transformer import inat_base_architecture
from fairseq.models.nat.levenshtein_transformer import levenshtein_base_architecture
from fairseq.models.nat.nonautoregressive_transformer import base_architecture as nat_base_architecture

from .sizes import SIZES, sized_architecture


@dataclass(frozen=True)
class StudentFamily:
    fairseq_model: str
    family_defaults: object
    train_flags: tuple  # task/model flags the family needs when training
    decode_flags: tuple  # fairseq-generate flags for its decoding


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
}

STUDENT_ARCHS = {}
for _family_name, _family in STUDENT_FAMILIES.items():
    for _size_name, _size in SIZES.items():
        _arch = f"kd_{_family_name}_{_size_name}"
        register_model_architecture(_family.fairseq_model, _arch)(
            sized_architecture(_size, _family.family_defaults)
        )
        STUDENT_ARCHS[_arch] = (_family_name, _size)
