"""``kd_translation_lev``: fairseq's translation_lev task that tells the model the update number.

fairseq's base task calls ``model.set_num_updates(update_num)`` before every training step; translation_lev
overrides train_step and skips it, so a model annealing a schedule over updates (glancing) would only learn
the update number when a checkpoint is loaded. Everything else is translation_lev's.
"""
from fairseq.tasks import register_task
from fairseq.tasks.translation_lev import TranslationLevenshteinConfig, TranslationLevenshteinTask


@register_task("kd_translation_lev", dataclass=TranslationLevenshteinConfig)
class UpdateAwareTranslationLevenshteinTask(TranslationLevenshteinTask):
    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        model.set_num_updates(update_num)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad=ignore_grad)
