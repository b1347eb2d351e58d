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
"""
import os
from dataclasses import dataclass, field

import torch
from fairseq import utils
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
        paths = utils.split_paths(self.cfg.data)
        folder = paths[(epoch - 1) % len(paths)]
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        prefixes = [os.path.join(folder, f"{split}.ref{k}.{src}-{tgt}.{tgt}") for k in range(2, self.cfg.references + 1)]
        found = [data_utils.load_indexed_dataset(p, self.tgt_dict, self.cfg.dataset_impl) for p in prefixes]
        if all(dataset is None for dataset in found):
            return  # a split with one reference (validation, test)
        missing = [p for p, dataset in zip(prefixes, found) if dataset is None]
        if missing:
            raise FileNotFoundError(f"--references {self.cfg.references}: {missing[0]}.bin is missing; the split has "
                                    f"{len(found) - len(missing) + 1} references")
        extra = [PrependTokenDataset(dataset, self.tgt_dict.bos()) for dataset in found]
        self.datasets[split] = MultiReferenceDataset(self.datasets[split], extra, self.tgt_dict.pad())
