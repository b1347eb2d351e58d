"""Several references a sentence: DDRS's annealed loss (Shao et al., NAACL 2022, as ictnlp/DDRS-NAT computes it)
worked by hand and from the single-reference losses computed one by one; the per-token selecting and averaging
losses against the same; glancing at the selected reference, and the task's batches."""
import pytest
import torch
import torch.nn.functional as F

from fairseq_plugins.counting import build_model
from fairseq_plugins.models.ctc import ctc_best_alignment, ctc_fit
from fairseq_plugins.models.upsampling import upsampled_inputs

MICRO = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16,
             encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
             decoder_attention_heads=2, dropout=0.0, label_smoothing=0.0, glance_anneal_updates=200)
SOURCE_LENGTHS = [8, 6, 4, 7]  # real tokens, </s> included: 2x upsampled, 16, 12, 8 and 14 positions


def _batch(model, reference_lengths: list[list[int]], seed=0):
    """Sources as translation_lev pads them (left, ending with </s>) and K references a sentence, each framed
    <s> ... </s> and right-padded ([B, K, T]); a length 0 leaves that reference out (all padding)."""
    g = torch.Generator().manual_seed(seed)
    d = model.tgt_dict
    width = max(SOURCE_LENGTHS)
    src = torch.full((len(SOURCE_LENGTHS), width), d.pad())
    for b, n in enumerate(SOURCE_LENGTHS):
        src[b, width - n:] = torch.cat([torch.randint(d.nspecial, len(d), (n - 1,), generator=g),
                                        torch.tensor([d.eos()])])
    longest = max(max(row) for row in reference_lengths) + 2
    references = torch.full((len(SOURCE_LENGTHS), len(reference_lengths[0]), longest), d.pad())
    for b, row in enumerate(reference_lengths):
        for k, n in enumerate(row):
            if n:
                words = torch.randint(d.nspecial, len(d), (n,), generator=g)
                references[b, k, :n + 2] = torch.cat([torch.tensor([d.bos()]), words, torch.tensor([d.eos()])])
    return src, torch.tensor(SOURCE_LENGTHS), references


def _one_by_one(model, src, src_lengths, references) -> list[list[float | None]]:
    """Each sentence's loss against each of its references alone, as single-reference training computes it."""
    out = []
    for b in range(src.size(0)):
        row = []
        for k in range(references.size(1)):
            reference = references[b:b + 1, k]
            if reference.ne(model.pad).sum() == 0:
                row.append(None)
                continue
            outputs = model(src[b:b + 1], src_lengths[b:b + 1], None, reference)
            row.append(next(iter(outputs.values()))["loss"].item())
        out.append(row)
    return out


# the third sentence's second reference is longer than its 8 positions can hold: no alignment fits it, and its
# single-reference loss is 0 (zero_infinity); the fourth sentence has two references only
LENGTHS = [[5, 7, 3], [4, 4, 6], [3, 12, 2], [6, 3, 0]]


def test_the_selecting_loss_is_the_minimum_of_the_single_reference_losses():
    torch.manual_seed(0)
    model = build_model("kd_glat_ctc_tiny", 40, **MICRO).eval()  # no glancing: one pass, as single training
    src, src_lengths, references = _batch(model, LENGTHS)
    single = _one_by_one(model, src, src_lengths, references)
    assert single[2][1] == 0.0  # the reference no alignment fits
    fitting = [[v for k, v in enumerate(row) if v is not None and not (b == 2 and k == 1)]
               for b, row in enumerate(single)]
    expected = sum(min(row) for row in fitting) / len(fitting)
    loss = model.forward_references(src, src_lengths, references, "min")["ctc"]["loss"]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert min(single[2]) == 0.0 < min(fitting[2])  # the minimum with the unfit one would have been 0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_averaging_loss_is_the_mean_of_the_single_reference_losses():
    torch.manual_seed(0)
    model = build_model("kd_glat_ctc_tiny", 40, **MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS)
    single = _one_by_one(model, src, src_lengths, references)
    expected = sum(sum(v for v in row if v is not None) / sum(v is not None for v in row) for row in single) / 4
    loss = model.forward_references(src, src_lengths, references, "mean")["ctc"]["loss"]
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_glancing_samples_against_the_reference_the_first_pass_fits_best():
    torch.manual_seed(0)
    model = build_model("kd_glat_ctc_tiny", 40, **MICRO).train()
    model.set_num_updates(0)  # glancing ratio 0.5
    src, src_lengths, references = _batch(model, LENGTHS)
    inputs = upsampled_inputs(src, model.args.upsample_factor, model.unk, model.pad)
    input_lengths = inputs.ne(model.pad).sum(1)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=src_lengths)
        log_probs = F.log_softmax(model.decoder(normalize=False, prev_output_tokens=inputs,
                                                encoder_out=encoder_out).float(), -1)
        fits = []
        for k in range(references.size(1)):
            targets = references[:, k, 1:].masked_fill(references[:, k, 1:].eq(model.eos), model.pad)
            lengths = targets.ne(model.pad).sum(1)
            fit = ctc_fit(log_probs, input_lengths, targets, lengths, model.bos)
            fits.append(torch.where(lengths > 0, fit, torch.full_like(fit, float("inf"))))
    chosen = torch.stack(fits, 1).argmin(1)
    assert chosen[2] != 1 and chosen[3] != 2  # neither the unfit reference nor the missing one
    seen = {}
    glance = model.glance

    def recording(inputs, input_lengths, targets, target_lengths, encoder_out, log_probs=None):
        revealed, aligned = glance(inputs, input_lengths, targets, target_lengths, encoder_out, log_probs)
        seen["targets"], seen["aligned"] = targets.clone(), aligned
        return revealed, aligned

    model.glance = recording
    model.forward_references(src, src_lengths, references, "min")["ctc"]["loss"].backward()
    for b in range(4):
        reference = references[b, chosen[b], 1:]
        reference = reference[reference.ne(model.eos) & reference.ne(model.pad)]
        assert seen["targets"][b][:len(reference)].tolist() == reference.tolist()
        assert seen["targets"][b][len(reference):].eq(model.pad).all()
    # the labels revealed are the selected reference's best alignment under the first pass
    expected, _ = ctc_best_alignment(log_probs, input_lengths, seen["targets"], seen["targets"].ne(model.pad).sum(1),
                                     model.bos)
    assert torch.equal(seen["aligned"], expected)


def test_an_unknown_selection_is_refused():
    model = build_model("kd_glat_ctc_tiny", 40, **MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS)
    with pytest.raises(ValueError, match="'min' or 'mean'"):
        model.forward_references(src, src_lengths, references, "max")


def test_batches_carry_every_reference_in_the_batchs_own_order():
    """translation_lev's collater sorts a batch by source length: each row's references follow its pair."""
    from fairseq.data import Dictionary, LanguagePairDataset, PrependTokenDataset
    from fairseq.data.list_dataset import ListDataset

    from fairseq_plugins.tasks import MultiReferenceDataset

    d = Dictionary()
    for word in "abcdefgh":
        d.add_symbol(word)

    def line(*words):
        return torch.tensor([d.index(w) for w in words] + [d.eos()])

    sources = [line("a"), line("a", "b", "c"), line("a", "b")]
    targets = [line("d"), line("e", "e"), line("f", "f", "f")]
    second = [line("g"), line("h", "h", "h", "h"), line("g", "h")]
    sizes = [len(s) for s in sources]
    pairs = LanguagePairDataset(PrependTokenDataset(ListDataset(sources, sizes), d.bos()), sizes, d,
                                PrependTokenDataset(ListDataset(targets, [len(t) for t in targets]), d.bos()),
                                [len(t) + 1 for t in targets], d)
    dataset = MultiReferenceDataset(pairs, [PrependTokenDataset(ListDataset(second, [len(s) for s in second]),
                                                                d.bos())], d.pad())
    batch = dataset.collater([dataset[i] for i in range(3)])
    assert batch["id"].tolist() == [1, 2, 0]  # the longest source first
    for b, i in enumerate(batch["id"].tolist()):
        first = batch["references"][b, 0]
        assert first[first.ne(d.pad())].tolist() == [d.bos(), *targets[i].tolist()]
        other = batch["references"][b, 1]
        assert other[other.ne(d.pad())].tolist() == [d.bos(), *second[i].tolist()]
    with pytest.raises(ValueError, match="reference 2 has 2 lines, the pairs 3"):
        MultiReferenceDataset(pairs, [ListDataset(second[:2], [2, 5])], d.pad())


DAT_MICRO = dict(MICRO, upsample_factor=2)


def test_the_da_transformers_selecting_and_averaging_losses_against_its_single_reference_ones():
    """The DAG loss is a sentence's: over references, the minimum (a reference longer than the graph never
    chosen) and the mean of the fitting ones, as single-reference training computes each."""
    torch.manual_seed(0)
    model = build_model("kd_dat_tiny", 40, **DAT_MICRO).eval()
    # the graph has 2 x the source's real tokens (16, 12, 8, 14) vertices; a framed reference needs n + 2
    lengths = [[5, 7, 3], [4, 4, 6], [3, 12, 2], [6, 3, 0]]
    src, src_lengths, references = _batch(model, lengths)
    single = _one_by_one(model, src, src_lengths, references)
    assert single[2][1] == 0.0  # longer than its graph: left out of the single loss, which is then 0
    fitting = [[v for k, v in enumerate(row) if v is not None and not (b == 2 and k == 1)]
               for b, row in enumerate(single)]
    selecting = model.forward_references(src, src_lengths, references, "min")["dag"]["loss"]
    assert selecting.item() == pytest.approx(sum(min(row) for row in fitting) / 4, rel=1e-5)
    averaging = model.forward_references(src, src_lengths, references, "mean")["dag"]["loss"]
    assert averaging.item() == pytest.approx(sum(sum(row) / len(row) for row in fitting) / 4, rel=1e-5)
    selecting.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_da_transformer_glances_at_the_selected_reference_and_trains_on_it():
    torch.manual_seed(0)
    model = build_model("kd_dat_tiny", 40, **DAT_MICRO).train()
    model.set_num_updates(0)
    src, src_lengths, references = _batch(model, LENGTHS)
    seen = []
    trained = model._trained_nll

    def recording(encoder_out, vertices, tgt_tokens, first=None):
        seen.append(tgt_tokens.clone())
        return trained(encoder_out, vertices, tgt_tokens, first)

    model._trained_nll = recording
    loss = model.forward_references(src, src_lengths, references, "min")["dag"]["loss"]
    assert len(seen) == 1 and torch.isfinite(loss)
    with torch.no_grad():
        model.eval()
        nll = [[v for v in row] for row in _one_by_one(model, src, src_lengths, references)]
    for b, row in enumerate(nll):
        candidates = {k: v for k, v in enumerate(row) if v is not None and not (b == 2 and k == 1)}
        best = min(candidates, key=candidates.get)
        reference = references[b, best]
        assert seen[0][b][:int(reference.ne(model.pad).sum())].tolist() == reference[reference.ne(model.pad)].tolist()


# DDRS (ictnlp/DDRS-NAT, DDRSCriterion.curr_loss): per-sentence losses summed over tokens, annealed over t


def test_ddrs_anneals_from_the_mean_through_the_log_sum_exp_to_the_minimum():
    """Two sentences, two references each, losses and lengths chosen to be worked by hand:
    mean = (2 + 6 + 3 + 1) / (2 + 4 + 3 + 1) = 1.2;
    log-sum-exp = -(logsumexp(-2, -6) + logsumexp(-3, -1)) / ((2 + 4) / 2 + (3 + 1) / 2)
                = ((2 - log(1 + e^-4)) + (1 - log(1 + e^-2))) / 5 = (1.9818511 + 0.8730719) / 5 = 0.5709846;
    min = (2 + 1) / (2 + 1) = 1.0 (sentence 1 chooses its second reference, the shorter one).
    t = 0.5: 0.75 lse + 0.25 mean = 0.7282385; t = 0.8: a = (0.8 - 2/3) / (1/3) = 0.4, 0.4 min + 0.6 lse =
    0.7425908."""
    from fairseq_plugins.criterions.multi_reference import ddrs_loss, ddrs_progress

    nll = torch.tensor([[2.0, 6.0], [3.0, 1.0]], dtype=torch.float64)
    lengths, fits = torch.tensor([[2, 4], [3, 1]]), torch.ones(2, 2, dtype=torch.bool)
    # DDRS-NAT's recipe: 300,000 updates, a save every 5,000: t = update / 280,000
    for update, expected in ((0, 1.2), (140_000, 0.7282385), (224_000, 0.7425908), (280_000, 1.0)):
        t = ddrs_progress(update, 300_000, 5_000)
        assert ddrs_loss(nll, lengths, fits, t).item() == pytest.approx(expected, abs=1e-6), t


def _criterion(model, max_update, save_interval):
    from types import SimpleNamespace

    from fairseq_plugins.criterions.multi_reference import MultiReferenceNatLoss

    return MultiReferenceNatLoss(SimpleNamespace(target_dictionary=model.tgt_dict), 0.0, "ddrs", max_update,
                                 save_interval)


def _sample(src, src_lengths, references):
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths}, "target": references[:, 0],
            "prev_target": references[:, 0], "references": references, "nsentences": src.size(0),
            "ntokens": int(references[:, 0].ne(1).sum())}


def test_ddrs_chooses_the_reference_of_lowest_summed_loss_through_the_criterion():
    """With references of unequal lengths, DDRS's minimum (the summed loss, over the chosen references' summed
    lengths) chooses otherwise than the lowest loss per token: here [0, 1, 0, 0] against [1, 2, 0, 0], both
    worked out from the single-reference losses computed one sentence at a time. A reference no alignment
    fits (sentence 3's second, 12 tokens for 8 positions: loss 0) is never chosen."""
    torch.manual_seed(0)
    model = build_model("kd_ctc_tiny", 40, **MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS, seed=2)
    per_token = _one_by_one(model, src, src_lengths, references)
    fitting = [{k: v for k, v in enumerate(row) if v is not None and (b, k) != (2, 1)}
               for b, row in enumerate(per_token)]
    summed = [{k: v * LENGTHS[b][k] for k, v in row.items()} for b, row in enumerate(fitting)]
    by_sum = [min(row, key=row.get) for row in summed]
    assert by_sum == [0, 1, 0, 0] and [min(row, key=row.get) for row in fitting] == [1, 2, 0, 0]
    assert per_token[2][1] == 0.0  # would be the minimum were the unfit reference chosen
    expected = sum(row[k] for row, k in zip(summed, by_sum)) / sum(LENGTHS[b][k] for b, k in enumerate(by_sum))
    model.set_num_updates(140)  # t = 140 / (200 - 4 x 15) = 1: the minimum alone
    loss, _, _ = _criterion(model, 200, 15)(model, _sample(src, src_lengths, references))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_ddrs_annealed_loss_at_four_points_against_the_single_reference_losses():
    """t = update / (200 - 4 x 15) at updates 0, 70, 112, 140 (t = 0, 0.5, 0.8, 1), the three batch losses
    worked out in plain Python from the single-reference losses (summed over tokens)."""
    import math

    torch.manual_seed(0)
    model = build_model("kd_ctc_tiny", 40, **MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS, seed=2)
    per_token = _one_by_one(model, src, src_lengths, references)
    rows = [[(v * LENGTHS[b][k], LENGTHS[b][k]) for k, v in enumerate(row) if v is not None and (b, k) != (2, 1)]
            for b, row in enumerate(per_token)]
    mean = sum(s for row in rows for s, _ in row) / sum(n for row in rows for _, n in row)
    lse = (sum(-math.log(sum(math.exp(-s) for s, _ in row)) for row in rows)
           / sum(sum(n for _, n in row) / len(row) for row in rows))
    chosen = [min(row) for row in rows]
    minimum = sum(s for s, _ in chosen) / sum(n for _, n in chosen)
    criterion = _criterion(model, 200, 15)
    for update, expected in ((0, mean), (70, 0.75 * lse + 0.25 * mean), (112, 0.4 * minimum + 0.6 * lse),
                             (140, minimum)):
        model.set_num_updates(update)
        loss, _, _ = criterion(model, _sample(src, src_lengths, references))
        assert loss.item() == pytest.approx(expected, rel=1e-5), update


def test_ddrs_with_glancing_glances_at_each_reference_and_trains():
    torch.manual_seed(0)
    model = build_model("kd_glat_ctc_tiny", 40, **MICRO).train()
    model.set_num_updates(0)  # glancing ratio 0.5
    src, src_lengths, references = _batch(model, LENGTHS)
    seen = []
    glance = model.glance

    def recording(*args):
        seen.append(args[2].clone())
        return glance(*args)

    model.glance = recording
    loss, _, _ = _criterion(model, 200, 15)(model, _sample(src, src_lengths, references))
    assert len(seen) == 3 and torch.isfinite(loss)  # one glancing pass a reference
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_ddrs_is_refused_for_a_loss_without_per_sentence_ctc_losses():
    model = build_model("kd_dat_tiny", 40, **DAT_MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS)
    with pytest.raises(TypeError, match="--reference-selection ddrs: DATransformerModel has no per-sentence CTC loss"):
        _criterion(model, 200, 15)(model, _sample(src, src_lengths, references))


def test_the_per_token_selections_are_the_models_min_and_mean():
    from types import SimpleNamespace

    from fairseq_plugins.criterions.multi_reference import MultiReferenceNatLoss

    torch.manual_seed(0)
    model = build_model("kd_ctc_tiny", 40, **MICRO).eval()
    src, src_lengths, references = _batch(model, LENGTHS)
    for selection, own in (("per-token-min", "min"), ("per-token-mean", "mean")):
        criterion = MultiReferenceNatLoss(SimpleNamespace(target_dictionary=model.tgt_dict), 0.0, selection, 200, 15)
        loss, _, _ = criterion(model, _sample(src, src_lengths, references))
        assert loss.item() == model.forward_references(src, src_lengths, references, own)["ctc"]["loss"].item()
    with pytest.raises(ValueError, match="--reference-selection min: choose ddrs, per-token-min, per-token-mean"):
        MultiReferenceNatLoss(SimpleNamespace(target_dictionary=model.tgt_dict), 0.0, "min", 200, 15)


def test_a_reference_fits_where_torchs_ctc_loss_is_finite():
    """ctc_fits against torch's own CTC loss without zero_infinity: a repeat needs a blank between, padding is
    not the reference's, an empty reference fits nothing."""
    from fairseq_plugins.models.ctc import ctc_fits

    targets = torch.tensor([[3, 4, 5, 1], [3, 3, 4, 1], [3, 3, 3, 3], [3, 4, 4, 1], [1, 1, 1, 1]])
    lengths = torch.tensor([3, 3, 4, 2, 0])
    inputs = torch.tensor([3, 3, 7, 3, 4])
    log_probs = torch.randn(5, 7, 6, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    finite = torch.isfinite(F.ctc_loss(log_probs.transpose(0, 1), targets, inputs, lengths, blank=0,
                                       reduction="none", zero_infinity=False))
    assert finite.tolist()[:4] == [True, False, True, True]  # 3 + 1 repeat > 3 positions; 4 + 3 = 7 fits
    assert ctc_fits(targets, lengths, inputs).tolist() == [True, False, True, True, False]
