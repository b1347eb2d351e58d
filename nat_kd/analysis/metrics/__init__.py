"""The analysis metrics: each a small class whose score object carries the signature of its settings; and the
measures, what an analysis report records of every training set (``Measure``), registered in ``MEASURES``.

``MEASURES`` is what every table of measures reads: the report (report.md, report.json's rows), the dataset
card, nat_kd.choose's ranking and the study's tables. Its order is the order of a report row's entries (the
measures that need nothing first, then those that need MODES, then DETAILS), and of the columns of every table
but where a ``Column`` says ``before``. A new measure is a subclass of ``Measure`` in its own module and one
entry here (docs/extending.md, "Add a measure").
"""
from nat_kd.analysis.metrics.base import (AlignedCorpus, Column, Measure, MeasuredSet, MeasureSettings, Signature,
                                          align_corpus)
from nat_kd.analysis.metrics.bleu import BleuVsReal, LengthRatio
from nat_kd.analysis.metrics.complexity import Complexity, ComplexityScore, TypeComplexity
from nat_kd.analysis.metrics.faithfulness import (DEFAULT_FLOOR, Faithfulness, FaithfulnessByFloor, FaithfulnessScore,
                                                  FlooredFaithfulness, MissingMass, MissingWords, UnigramFaithfulness)
from nat_kd.analysis.metrics.frequency import (ComplexityByFrequency, SourceFrequencyBuckets, TokenWeightedComplexity,
                                               WordsLosingAll)
from nat_kd.analysis.metrics.modes import ModeMix, ModePurity, Modes, ModesScore, ModeUnknown, UnigramModels
from nat_kd.analysis.metrics.reordering import FuzzyReordering, Reordering, ReorderingScore
from nat_kd.analysis.metrics.surface import RepeatedNgramShare, TargetTokens, TargetTypes

MEASURES: dict[str, type[Measure]] = {measure.name: measure for measure in (
    TypeComplexity, TokenWeightedComplexity, ComplexityByFrequency, FlooredFaithfulness, MissingWords,
    FaithfulnessByFloor, MissingMass, UnigramFaithfulness, FuzzyReordering, SourceFrequencyBuckets, WordsLosingAll,
    BleuVsReal, LengthRatio, ModePurity, ModeMix, ModeUnknown, TargetTypes, TargetTokens, RepeatedNgramShare)}


def shown(table: str) -> list[tuple[type[Measure], Column]]:
    """The measures that ``table`` shows, in its order, each with its column there (the measure's own label and
    format filled in where the column gives none)."""
    columns = [(measure, Column(measure.label if column.label is None else column.label,
                                measure.format if column.format is None else column.format, column.before))
               for measure in MEASURES.values() if (column := measure.tables.get(table)) is not None]
    for entry in [entry for entry in columns if entry[1].before]:
        others = [measure.name for measure, _ in columns if measure is not entry[0]]
        if entry[1].before in others:
            columns.remove(entry)
            columns.insert(others.index(entry[1].before), entry)
    return columns


__all__ = ["AlignedCorpus", "Column", "Measure", "MeasuredSet", "MeasureSettings", "Signature", "align_corpus",
           "Complexity", "ComplexityScore", "Faithfulness", "FaithfulnessScore", "DEFAULT_FLOOR", "Modes",
           "ModesScore", "UnigramModels", "Reordering", "ReorderingScore", "MEASURES", "shown"]
