"""What each compile stage needs of a domain's labelled data, checked before any LM call."""

from pathlib import Path

import pytest

from crag_dspy.domain import CorpusDoc, Domain, DomainConfig, QAPair, RelevancePair
from optimize.data_needs import MIN_JUDGE_PAIRS, MIN_QA_QUESTIONS, guidance, shortfalls

DOCS = [CorpusDoc(id="a", title="Pump", text="The pump moves 40 litres per minute.")]


def domain(relevance=(), qa=()):
    return Domain(Path("pump"), DomainConfig(name="pump"), DOCS, qa=list(qa), relevance=list(relevance))


def pairs(split, positives, negatives):
    return [
        RelevancePair(
            question=f"q{split}{i}",
            passage="Pump\nThe pump moves 40 litres per minute.",
            label=label,
            split=split,
        )
        for i, label in enumerate([1] * positives + [0] * negatives)
    ]


def questions(split, n):
    return [QAPair(id=f"{split}{i}", question=f"Q {i}?", answers=["40"], split=split) for i in range(n)]


def test_a_documents_only_domain_lacks_everything_the_default_compile_needs():
    missing = shortfalls(domain(), ("grader", "strips"), thresholds=True, test=True)
    assert [s.what for s in missing] == [
        "relevance.jsonl train pairs",
        "relevance.jsonl val pairs",
        "strip examples (train, derived from relevance.jsonl)",
        "strip examples (val, derived from relevance.jsonl)",
        "qa.jsonl val questions",
        "qa.jsonl test questions",
    ]
    message = guidance(Path("data/pump"), missing)
    assert "qa.jsonl val questions: 0 of at least 1, for thresholds" in message
    assert "crag-dspy synthesize --domain-dir data/pump" in message  # the command that makes it
    assert "--stages grader --no-thresholds --no-test-eval" in message


def test_enough_data_of_both_labels_lacks_nothing():
    half = MIN_JUDGE_PAIRS // 2  # one of each label
    data = domain(
        [*pairs("train", half, half), *pairs("val", half, half)],
        [*questions("val", MIN_QA_QUESTIONS), *questions("test", MIN_QA_QUESTIONS)],
    )
    assert shortfalls(data, ("grader",), thresholds=True, test=True) == []


@pytest.mark.parametrize("positives, negatives", [(3, 0), (0, 3), (1, 0), (0, 0)])
def test_a_judge_needs_both_labels_and_enough_pairs(positives, negatives):
    data = domain([*pairs("train", positives, negatives), *pairs("val", 2, 2)])
    (missing,) = shortfalls(data, ("grader",), thresholds=False, test=False)
    assert missing.what == "relevance.jsonl train pairs" and missing.have == positives + negatives
    if positives + negatives:
        assert "both are needed" in str(missing)


def test_only_the_stages_asked_for_are_checked():
    assert shortfalls(domain(), (), thresholds=False, test=False) == []
    (missing,) = shortfalls(
        domain(qa=questions("val", 9)), ("rewriter", "answerer"), thresholds=True, test=False
    )
    assert missing.what == "qa.jsonl train questions" and missing.stages == ("rewriter", "answerer")
    (missing,) = shortfalls(domain(qa=questions("train", 9)), ("retry",), thresholds=True, test=False)
    assert missing.stages == ("thresholds", "retry")


def test_the_module_example_runs():
    import doctest

    import optimize.data_needs

    result = doctest.testmod(optimize.data_needs)
    assert result.attempted and not result.failed


def test_a_grader_compiled_on_synthetic_pairs_only_is_warned_about():
    from optimize.data_needs import synthetic_grader_warning

    synthetic = [
        p.model_copy(update={"source": "synthetic"}) for p in [*pairs("train", 1, 1), *pairs("val", 1, 1)]
    ]
    warning = synthetic_grader_warning(domain(synthetic), ("grader",))
    assert warning and "every relevance pair is synthetic" in warning and "--stages" in warning
    assert synthetic_grader_warning(domain(synthetic), ("strips",)) is None  # the grader is not compiled
    mixed = [*synthetic, *pairs("val", 1, 0)]  # one hand-labelled pair: the val measure is not all synthetic
    assert synthetic_grader_warning(domain(mixed), ("grader",)) is None
    assert synthetic_grader_warning(domain(), ("grader",)) is None
