"""The analysis metrics: each a small class whose score object carries the signature of its settings; and the
measures, what an analysis report records of every training set (``Measure``), registered in ``MEASURES``.

``MEASURES`` is what every table of measures reads: the report (report.md, report.json's rows), the dataset
card, nat_kd.choose's ranking and the study's tables. Its order is the order of a report row's entries (the
measures that need nothing first, then those that need MODES, then DETAILS), and of the columns of every table
but where a ``Column`` says ``before``. A new measure is a subclass of ``Measure`` in its own module and one
entry here, or a ``register_measure`` call in the code that runs the report (docs/extending.md, "Add a measure").
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
from nat_kd.analysis.metrics.sentence import OWN_COLUMNS
from nat_kd.analysis.metrics.surface import RepeatedNgramShare, TargetTokens, TargetTypes

MEASURES: dict[str, type[Measure]] = {}


def register_measure(measure: type[Measure]) -> type[Measure]:
    """Add ``measure`` under its ``name``, after the measures registered before it (usable as a class decorator).
    The same class again changes nothing; a name, or a per-line column (``line_column``), that another holds is
    refused."""
    known = MEASURES.get(measure.name)
    if known is measure:
        return measure
    if known is not None:
        raise ValueError(f"measure {measure.name!r} is {known.__module__}.{known.__qualname__} already, not "
                         f"{measure.__module__}.{measure.__qualname__}")
    column = measure.line_column
    holder = next((m for m in MEASURES.values() if m.line_column == column), None) if column else None
    if column in OWN_COLUMNS or holder is not None:
        raise ValueError(f"scores.tsv's column {column!r} is "
                         + (f"measure {holder.name!r}'s" if holder else "the sentence scorer's")
                         + f" already: give {measure.__qualname__} a line_column of its own")
    MEASURES[measure.name] = measure
    return measure


for _measure in (TypeComplexity, TokenWeightedComplexity, ComplexityByFrequency, FlooredFaithfulness, MissingWords,
                 FaithfulnessByFloor, MissingMass, UnigramFaithfulness, FuzzyReordering, SourceFrequencyBuckets,
                 WordsLosingAll, BleuVsReal, LengthRatio, ModePurity, ModeMix, ModeUnknown, TargetTypes, TargetTokens,
                 RepeatedNgramShare):
    register_measure(_measure)


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
           "ModesScore", "UnigramModels", "Reordering", "ReorderingScore", "MEASURES", "register_measure", "shown"]
