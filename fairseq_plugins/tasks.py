"""``kd_translation_lev``: fairseq's translation_lev task that tells the model the update number, and reads
several references per source line where a training set has them.

fairseq's base task calls ``model.set_num_updates(update_num)`` before every training step; translation_lev
overrides train_step and skips it, so a model annealing a schedule over updates (glancing) would only learn
the update number when a checkpoint is loaded.

``--references K`` (default 1): each line of a split whose folder holds ``SPLIT.refN.SRC-TGT.TGT`` for N = 2..K
(K - 1 more targets of the same sources, e.g. other teachers' outputs: nat_kd's multi-reference sets) also
carries those: a batch holds all K as ``references`` [B, K, T] for a criterion that takes them
(``multi_reference_nat_loss``). A split without them (validation, test) is read as translation_lev reads it.
Everything else is translation_lev's.

``selective_kd_translation_lev``: Selective KD (Liu et al., AAAI 2023) as NJUNLP/SelectiveKD's
``translation_selective_kd`` task trains (docs/authors_code.md): the training split's folder holds the distilled
pairs, the raw targets of the same lines (``SPLIT.raw.SRC-TGT.TGT``) and a frozen evaluator's accuracy on each
raw target (``SPLIT.evaluator_accuracy.txt``, one number a binarized line: nat_kd.selective_kd); each sentence
of each batch is trained on its distilled target where that accuracy is below the threshold of the update
(``kd_threshold_at``), on its raw target otherwise.
"""
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq import metrics, utils
from fairseq.data import BaseWrapperDataset, PrependTokenDataset, data_utils
from fairseq.tasks import register_task
from fairseq.tasks.translation_lev import TranslationLevenshteinConfig, TranslationLevenshteinTask


@dataclass
class KdTranslationLevenshteinConfig(TranslationLevenshteinConfig):
    references: int = field(default=1, metadata={"help": "references per source line of a split that has "
                                                          "SPLIT.refN.SRC-TGT.TGT for N = 2..K"})


class MultiReferenceDataset(BaseWrapperDataset):
    """A language-pair dataset whose lines have K targets: the pair's own and ``extra`` (K - 1 datasets of
    token ids, framed <s> ... </s> as translation_lev frames its targets). Batches are made and ordered as the
    pairs' are (by the first target); each adds ``references`` [B, K, T], padded, in the batch's order."""

    def __init__(self, pairs, extra: list, pad: int):
        super().__init__(pairs)
        for k, dataset in enumerate(extra, start=2):
            if len(dataset) != len(pairs):
                raise ValueError(f"reference {k} has {len(dataset)} lines, the pairs {len(pairs)}: a multi-reference "
                                 "set's references are line-aligned with its sources")
        self.extra, self.pad = extra, pad

    def __getitem__(self, index):
        item = self.dataset[index]
        item["references"] = [item["target"], *(dataset[index] for dataset in self.extra)]
        return item

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        by_id = {sample["id"]: sample["references"] for sample in samples}
        rows = [by_id[i] for i in batch["id"].tolist()]  # the pairs' collater sorts the batch by source length
        longest = max(len(reference) for row in rows for reference in row)
        references = torch.full((len(rows), len(rows[0]), longest), self.pad, dtype=torch.long)
        for b, row in enumerate(rows):
            for k, reference in enumerate(row):
                references[b, k, :len(reference)] = reference
        batch["references"] = references
        return batch


@register_task("kd_translation_lev", dataclass=KdTranslationLevenshteinConfig)
class UpdateAwareTranslationLevenshteinTask(TranslationLevenshteinTask):
    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        model.set_num_updates(update_num)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad=ignore_grad)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        if self.cfg.references < 2:
            return
        extra = self.more_targets(split, epoch, [f"ref{k}" for k in range(2, self.cfg.references + 1)])
        if extra is not None:
            self.datasets[split] = MultiReferenceDataset(self.datasets[split], extra, self.tgt_dict.pad())

    def more_targets(self, split: str, epoch: int, names: list[str]) -> list | None:
        """The split's other targets SPLIT.NAME.SRC-TGT.TGT, one dataset a name, framed <s> ... </s>; None where
        the split has none of them (validation, test)."""
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        prefixes = [os.path.join(self.data_folder(epoch), f"{split}.{name}.{src}-{tgt}.{tgt}") for name in names]
        found = [data_utils.load_indexed_dataset(p, self.tgt_dict, self.cfg.dataset_impl) for p in prefixes]
        if all(dataset is None for dataset in found):
            return None
        missing = [p for p, dataset in zip(prefixes, found) if dataset is None]
        if missing:
            present = ", ".join(name for name, dataset in zip(names, found) if dataset is not None)
            raise FileNotFoundError(f"{missing[0]}.bin is missing; the split has {present}")
        return [PrependTokenDataset(dataset, self.tgt_dict.bos()) for dataset in found]

    def data_folder(self, epoch: int) -> str:
        paths = utils.split_paths(self.cfg.data)
        return paths[(epoch - 1) % len(paths)]


def kd_threshold_at(update: int, threshold: float, offset: float, updates: int) -> float:
    """Selective KD's threshold at ``update``: ``threshold + update / updates x offset`` (SelectiveKD's
    ``kd_threshold + (update_num / total_up) x kd_threshold_offset``, not capped)."""
    return threshold + update / updates * offset


def selective_targets(distilled, raw, accuracy, threshold: float, pad: int):
    """Each sentence's training target ([B, T], padded): its distilled one (``distilled`` [B, T1]) where the
    evaluator's ``accuracy`` [B] on its raw one (``raw`` [B, T2]) is below ``threshold``, the raw one otherwise;
    and which took the distilled one ([B] bool)."""
    use_kd = accuracy < threshold
    width = max(distilled.size(1), raw.size(1))
    distilled = torch.nn.functional.pad(distilled, (0, width - distilled.size(1)), value=pad)
    raw = torch.nn.functional.pad(raw, (0, width - raw.size(1)), value=pad)
    targets = torch.where(use_kd.unsqueeze(1), distilled, raw)
    return targets[:, :int(targets.ne(pad).sum(1).max())], use_kd


RAW_TARGETS = "raw"  # SPLIT.raw.SRC-TGT.TGT: the raw targets of a Selective KD set's lines
ACCURACY_FILE = "{split}.evaluator_accuracy.txt"  # the evaluator's accuracy on each, one a binarized line


@dataclass
class SelectiveKdConfig(KdTranslationLevenshteinConfig):
    # the README's recipe: --kd-threshold 0.4 --kd-threshold-offset 0.6 (the code's own defaults: 0.3, 0.0)
    kd_threshold: float = field(default=0.4, metadata={
        "help": "a sentence takes its distilled target where the evaluator's accuracy on its raw one is below "
                "kd_threshold + update / kd_threshold_updates x kd_threshold_offset"})
    kd_threshold_offset: float = field(default=0.6, metadata={"help": "see --kd-threshold"})
    kd_threshold_updates: int = field(default=300000, metadata={
        "help": "see --kd-threshold (SelectiveKD's --total-up, 300000: its recipe's --max-update)"})


@register_task("selective_kd_translation_lev", dataclass=SelectiveKdConfig)
class SelectiveKdTask(UpdateAwareTranslationLevenshteinTask):
    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        raw = self.more_targets(split, epoch, [RAW_TARGETS])
        if raw is None:
            return  # validation, test: their own targets
        path = os.path.join(self.data_folder(epoch), ACCURACY_FILE.format(split=split))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: the evaluator's accuracy on each raw target (python -m "
                                    "nat_kd.selective_kd writes it)")
        accuracy = np.loadtxt(path, dtype=np.float64, ndmin=1)
        if len(accuracy) != len(self.datasets[split]):
            raise ValueError(f"{path} has {len(accuracy)} lines, the split {len(self.datasets[split])} pairs: one "
                             "accuracy a binarized line (rebuild it with python -m nat_kd.selective_kd)")
        self.accuracy = torch.from_numpy(accuracy)
        self.datasets[split] = MultiReferenceDataset(self.datasets[split], raw, self.tgt_dict.pad())

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if "references" in sample:
            references = sample.pop("references")
            threshold = kd_threshold_at(update_num, self.cfg.kd_threshold, self.cfg.kd_threshold_offset,
                                        self.cfg.kd_threshold_updates)
            accuracy = self.accuracy[sample["id"].cpu()].to(references.device)
            pad = self.tgt_dict.pad()
            sample["target"], use_kd = selective_targets(references[:, 0], references[:, 1], accuracy, threshold, pad)
            sample["ntokens"] = int(sample["target"].ne(pad).sum())
            metrics.log_scalar("distilled_share", use_kd.float().mean().item(), round=3)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad=ignore_grad)
