"""Registered architectures build, and their sizes are the paper's teachers' (within 10%, exact by formula)."""
import pytest

import fairseq_plugins  # noqa: F401  (registers the architectures)
from fairseq_plugins.counting import count_parameters
from fairseq_plugins.models.sizes import SIZES
from fairseq_plugins.models.nat import STUDENT_ARCHS, STUDENT_FAMILIES
from fairseq_plugins.models.transformer import TRANSFORMER_ARCHS

PAPER_TEACHER_PARAMS = {"tiny": 16e6, "small": 37e6, "base": 65e6, "big": 218e6}


def transformer_params(vocab: int, d: int, ffn: int, layers: int) -> int:
    """Closed form for fairseq's post-norm transformer with all embeddings shared, sinusoidal positions."""
    attention = 4 * d * d + 4 * d  # q, k, v, out projections with biases
    feed_forward = 2 * d * ffn + ffn + d
    layer_norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    return vocab * d + layers * (encoder_layer + decoder_layer)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.slow
def test_teacher_parameter_count_matches_formula_and_paper(size):
    s = SIZES[size]
    counted = count_parameters(f"kd_transformer_{size}", 40000)
    assert counted == transformer_params(40000, s.embed_dim, s.ffn_dim, s.layers)
    assert abs(counted - PAPER_TEACHER_PARAMS[size]) <= 0.10 * PAPER_TEACHER_PARAMS[size]


def test_hand_computed_tiny_teacher():
    # 40000*256 + 3*(263168 + 525568 + 1024) + 3*(2*263168 + 525568 + 1536), worked out by hand
    assert count_parameters("kd_transformer_tiny", 40000) == 15_769_600


def test_every_size_registered_for_teachers_and_each_student_family():
    assert set(TRANSFORMER_ARCHS) == {f"kd_transformer_{s}" for s in SIZES}
    assert set(STUDENT_ARCHS) == {f"kd_{f}_{s}" for f in STUDENT_FAMILIES for s in SIZES}


@pytest.mark.parametrize("family", [f for f in STUDENT_FAMILIES if f != "nacrf"])  # nacrf: counted below
def test_students_are_teacher_sized(family):
    teacher = count_parameters("kd_transformer_tiny", 8008)
    student = count_parameters(f"kd_{family}_tiny", 8008)
    # same encoder/decoder; NAT heads add at most a few length/edit classifiers of d x d
    assert teacher <= student <= teacher + 3 * 256 * 256


def test_vanilla_nat_adds_exactly_its_length_embedding():
    # 256 possible lengths x 256 dims: the only module a vanilla NAT has beyond the AT transformer
    assert count_parameters("kd_nat_tiny", 8008) - count_parameters("kd_transformer_tiny", 8008) == 256 * 256


def test_command_line_size_flags_override_the_architecture():
    from fairseq_plugins.counting import build_model

    model = build_model("kd_transformer_tiny", 100, encoder_layers=1, decoder_layers=1)
    assert len(model.encoder.layers) == 1 and len(model.decoder.layers) == 1
    assert model.encoder.embed_tokens.embedding_dim == 256


def test_plugin_students_are_registered_on_their_models():
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_plugins.models.ctc import CTCNATModel
    from fairseq_plugins.models.glat import GLATModel
    from fairseq_plugins.models.nacrf import NACRFModel

    for size in SIZES:
        assert ARCH_MODEL_REGISTRY[f"kd_glat_{size}"] is GLATModel
        assert ARCH_MODEL_REGISTRY[f"kd_ctc_{size}"] is CTCNATModel
        assert ARCH_MODEL_REGISTRY[f"kd_glat_ctc_{size}"] is CTCNATModel
        assert ARCH_MODEL_REGISTRY[f"kd_nacrf_{size}"] is NACRFModel


def test_plugin_students_add_exactly_their_modules():
    teacher, nat = count_parameters("kd_transformer_tiny", 8008), count_parameters("kd_nat_tiny", 8008)
    assert count_parameters("kd_glat_tiny", 8008) == nat  # glancing is training only
    # CTC: the output length is a multiple of the source length, no length embedding
    assert count_parameters("kd_ctc_tiny", 8008) == count_parameters("kd_glat_ctc_tiny", 8008) == teacher
    # NAT-CRF: transitions of rank 32 (two 8008 x 32 embeddings), and pre-norm layers' two final layer norms
    assert count_parameters("kd_nacrf_tiny", 8008) == nat + 2 * 8008 * 32 + 2 * 2 * 256
