import pytest

from optimize.metrics import (
    answer_matches,
    binary_report,
    contains_answer,
    is_answerable,
    normalize_answer,
    roc_auc,
    truthfulness_score,
    truthfulness_summary,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,240 Velds.", "1240 velds"),
        ("The  AquaProbe-220", "aquaprobe 220"),
        ("an answer", "answer"),
        ("90%", "90%"),
        ("I don’t know", "i don t know"),
        ("ＩＰ６８", "ip68"),
        ("", ""),
        ("...!?", ""),
        ("The", ""),
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("A.B.", "b"),  # "a" standing alone after punctuation is an article
        ("12,5 mg", "12 5 mg"),  # a decimal comma is not a thousands separator
        ("1,240,000", "1240000"),
        ("1\u202f240 velds", "1240 velds"),  # narrow no-break space as thousands separator
        ("2,50", "2 50"),
        ("Line\none\ttwo", "line one two"),
        ("Café", "café"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("prediction", "aliases", "expected"),
    [
        ("The limit is 1,240 velds per sensor.", ["1240 velds"], True),
        ("It is 20 m deep", ["20 m", "20 metres"], True),
        ("120 m", ["20 m"], False),  # whole words only
        ("IP68", ["IP67"], False),
        ("I don't know", ["I don't know"], True),
        ("I do not know.", ["I don't know"], True),
        ("90 days", ["I don't know"], False),
        ("I don't know, maybe 90 days", ["90 days"], False),  # hedging abstention is not an answer
        ("", ["x"], False),
        (None, ["x"], False),
        ("Z100.", ["Z100"], True),  # trailing punctuation
        ("code: z100", ["Z100"], True),  # case
        ("Z1000", ["Z100"], False),
        ("The answer is 1,240.", ["1240"], True),
        ("1240", ["1,240"], True),
        ("about 90%", ["90%"], True),
        ("90", ["90%"], False),
        ("every 90 days", ["90 days", "every 90 days"], True),  # any alias
        ("12–14 May 2026", ["12-14 May 2026"], False),  # an en dash is not a hyphen: list both aliases
        ("12–14 May 2026", ["12-14 May 2026", "12–14 May 2026"], True),
        ("I DON'T KNOW.", ["I don't know"], True),
        ("I don\u2019t know", ["I do not know"], True),  # curly apostrophe and the other spelling
        ("Sorry, I don't know.", ["I don't know"], True),
        ("I know", ["I don't know"], False),
        ("x", [], False),
        ("x", [""], False),  # an empty alias never matches
        ("the", ["The"], False),  # an alias that normalizes to nothing never matches
        ("I don't know", ["I don't know", "Z100"], True),  # mixed: abstaining is accepted
        ("Z100", ["I don't know", "Z100"], True),
    ],
)
def test_answer_matches(prediction, aliases, expected):
    assert answer_matches(prediction, aliases) is expected


def test_roc_auc():
    assert roc_auc([0.9, 0.8, 0.1], [1, 1, 0]) == 1.0
    assert roc_auc([0.1, 0.9], [1, 0]) == 0.0
    assert roc_auc([0.5, 0.5], [1, 0]) == 0.5
    assert roc_auc([0.5], [1]) is None


def test_binary_report_counts_unknown_as_wrong():
    report = binary_report([0.9, 0.2, None, 0.7], [1, 0, 1, 0])
    assert report.n == 4 and report.unknown == 1
    assert report.accuracy == 0.5
    assert report.precision == 0.5 and report.recall == 0.5
    with pytest.raises(ValueError):
        binary_report([0.1], [1, 0])


@pytest.mark.parametrize(
    ("text", "aliases", "expected"),
    [
        ("Pricing\nThe AquaProbe 220 costs 1,240 velds.", ["1240 velds"], True),
        ("It costs 1,240 velds each", ["1,240 velds per sensor", "1240 velds"], True),
        ("It costs 11,240 velds", ["1240 velds"], False),
        ("We do not know yet.", ["I don't know"], False),  # the unanswerable marker is never "held"
        ("I don't know", ["I don't know"], False),
        ("", ["x"], False),
        (None, ["x"], False),
        ("no gold here", [], False),
    ],
)
def test_contains_answer(text, aliases, expected):
    assert contains_answer(text, aliases) is expected


@pytest.mark.parametrize(
    ("aliases", "expected"),
    [
        (["I don't know"], False),
        (["I do not know", "i don\u2019t know"], False),
        ([""], False),
        ([], False),
        (["90 days"], True),
        (["I don't know", "90 days"], True),
    ],
)
def test_is_answerable(aliases, expected):
    assert is_answerable(aliases) is expected


def test_binary_report_edge_cases():
    empty = binary_report([], [])
    assert (empty.n, empty.accuracy, empty.precision, empty.recall, empty.f1, empty.roc_auc) == (
        0,
        0,
        0,
        0,
        0,
        None,
    )
    all_no = binary_report([0.1, 0.2], [0, 0])
    assert (
        all_no.accuracy == 1.0 and all_no.precision == 0.0 and all_no.recall == 0.0 and all_no.roc_auc is None
    )
    at_threshold = binary_report([0.5, 0.49], [1, 0])
    assert at_threshold.accuracy == 1.0 and at_threshold.f1 == 1.0  # the threshold itself predicts yes
    strict = binary_report([0.6, 0.7], [1, 0], threshold=0.65)
    assert strict.accuracy == 0.0 and strict.roc_auc == 0.0
    unknown_only = binary_report([None, None], [1, 0])
    assert unknown_only.accuracy == 0.0 and unknown_only.unknown == 2 and unknown_only.roc_auc is None


def test_roc_auc_with_ties_and_order():
    assert roc_auc([0.8, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert roc_auc([0.2, 0.9, 0.5], [0, 1, 1]) == 1.0
    assert roc_auc([], []) is None


def test_wilson_interval_matches_known_values():
    from optimize.metrics import wilson_interval

    # Wilson 95% for 8/10: (0.4902, 0.9433) (Agresti & Coull's tables; statsmodels gives the same).
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(40, 40)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.9124, abs=1e-4)


def test_mcnemar_exact_counts_only_discordant_pairs():
    from optimize.metrics import mcnemar_exact

    # 10 discordant pairs split 9/1: two-sided binomial p = 2 * P(X <= 1 | n=10) = 22/1024.
    first = [True] * 9 + [False] + [True] * 30
    second = [False] * 9 + [True] + [True] * 30
    assert mcnemar_exact(first, second) == pytest.approx(22 / 1024)
    assert mcnemar_exact(second, first) == pytest.approx(22 / 1024)
    assert mcnemar_exact([True, False], [True, False]) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        mcnemar_exact([True], [True, False])


def test_bootstrap_auc_interval_resamples_questions():
    from optimize.metrics import bootstrap_auc_interval

    scores = [0.9, 0.8, 0.2, 0.1, 0.7, 0.3, 0.6, 0.4]
    labels = [1, 1, 0, 0, 1, 0, 1, 0]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c"]
    low, high = bootstrap_auc_interval(scores, labels, groups, resamples=200)
    assert low == high == 1.0  # perfectly ranked in every resample
    noisy = bootstrap_auc_interval([0.5, 0.4, 0.6, 0.3], [1, 0, 0, 1], ["a", "b", "c", "d"], resamples=300)
    assert noisy is not None and noisy[0] < noisy[1]
    assert bootstrap_auc_interval([0.1, None], [1, 0], ["a", "b"]) is None


def test_bootstrap_ratio_interval_resamples_pairs():
    from optimize.metrics import bootstrap_ratio_interval

    # Two items: a resample holds the first twice (ratio 1), the second twice (3) or one of each (2).
    assert bootstrap_ratio_interval([1.0, 3.0], [1.0, 1.0]) == pytest.approx((1.0, 3.0))
    # Paired: a slow question is slow for both systems, so the ratio stays near 1 although the
    # questions' times differ tenfold (resampled unpaired, the ratio would range from ~0.2 to ~5).
    low, high = bootstrap_ratio_interval([10.5, 1.0, 5.0, 2.1], [10.0, 1.05, 5.2, 2.0])
    assert 0.95 < low < 1.0 < high < 1.06
    assert bootstrap_ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == (2.0, 2.0)
    assert bootstrap_ratio_interval([1.0], [1.0]) is None
    assert bootstrap_ratio_interval([1.0, 2.0], [0.0, 0.0]) is None
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap_ratio_interval([1.0, 2.0], [1.0])


def test_a_gain_ships_only_beyond_noise():
    from optimize.metrics import beats_beyond_noise

    # 6 questions only the candidate gets right, none the other way: p = 2 / 2**6 = 0.031.
    better = [True] * 6 + [False] * 4
    assert beats_beyond_noise(better, [False] * 10) == (True, pytest.approx(0.03125))
    # 5 of 5 discordant pairs is p = 0.0625: a gain a coin could produce.
    assert beats_beyond_noise([True] * 5 + [False] * 5, [False] * 10)[0] is False
    # Significant, but the reference is the better one: nothing ships.
    assert beats_beyond_noise([False] * 10, better)[0] is False
    assert beats_beyond_noise(better, [False] * 10, alpha=0.01)[0] is False


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("I don't know", True),
        ("I do not know.", True),
        ("I DON\u2019T KNOW", True),  # curly apostrophe, upper case
        ("Sorry, I don't know.", True),
        ("I don't know, maybe 90 days", True),  # a hedged abstention still abstains
        ("I know", False),
        ("90 days", False),
        ("", False),  # nothing said: no abstention, a wrong answer
        (None, False),  # a failed question
    ],
)
def test_is_abstention(prediction, expected):
    from optimize.metrics import is_abstention

    assert is_abstention(prediction) is expected


@pytest.mark.parametrize(
    ("prediction", "aliases", "score"),
    [
        ("90 days", ["90 days"], 1),  # right
        ("I don't know", ["I don't know"], 1),  # unanswerable, abstained: right
        ("I don't know", ["90 days"], 0),  # answerable, abstained: missing
        ("30 days", ["90 days"], -1),  # wrong
        ("90 days", ["I don't know"], -1),  # unanswerable, answered anyway: a hallucination
        (None, ["90 days"], -1),  # the question failed: wrong, not abstained
        (None, ["I don't know"], -1),
        ("I don't know, maybe 90 days", ["90 days"], 0),  # hedged: an abstention, not a right answer
    ],
)
def test_truthfulness_score_follows_the_crag_benchmark(prediction, aliases, score):
    from optimize.metrics import is_abstention, truthfulness_score

    correct = answer_matches(prediction, aliases)
    assert truthfulness_score(correct, is_abstention(prediction)) == score


def test_truthfulness_score_table():
    from optimize.metrics import truthfulness_score

    assert truthfulness_score(True, False) == 1
    assert truthfulness_score(True, True) == 1  # right by abstaining on an unanswerable question
    assert truthfulness_score(False, True) == 0
    assert truthfulness_score(False, False) == -1


def test_sign_test_ties_only_and_empty():
    from optimize.metrics import SignTest, sign_test

    assert sign_test([1, 0, -1], [1, 0, -1]) == SignTest(0, 0, 3, 1.0)
    assert sign_test([], []) == SignTest(0, 0, 0, 1.0)


def test_sign_test_all_wins_known_binomial_values():
    from optimize.metrics import sign_test

    # 5 wins of 5: two-sided p = 2 * 0.5**5.
    test = sign_test([1] * 5, [-1, 0, -1, 0, -1])
    assert (test.wins, test.losses, test.ties) == (5, 0, 0) and test.p_value == pytest.approx(2 / 32)
    # 8 wins, 2 losses: p = 2 * P(X <= 2 | n=10) = 2 * (1 + 10 + 45) / 1024; ties do not count.
    test = sign_test([1] * 8 + [-1] * 2 + [0] * 7, [0] * 8 + [1] * 2 + [0] * 7)
    assert (test.wins, test.losses, test.ties) == (8, 2, 7) and test.p_value == pytest.approx(112 / 1024)
    # 1 win, 0 losses: p = 1 (a coin does that half the time, either way).
    assert sign_test([1], [0]).p_value == pytest.approx(1.0)
    # 6 of 6: p = 2 / 64 < 0.05; the size of a difference does not matter, only its direction.
    assert (
        sign_test([1] * 6, [0] * 6).p_value == sign_test([1] * 6, [-1] * 6).p_value == pytest.approx(1 / 32)
    )


def test_sign_test_is_symmetric():
    from optimize.metrics import sign_test

    first, second = [1, 1, 0, -1, 1, 0, -1], [0, -1, 0, 1, 1, -1, -1]
    forward, backward = sign_test(first, second), sign_test(second, first)
    assert (forward.wins, forward.losses, forward.ties) == (3, 1, 3)
    assert (backward.wins, backward.losses, backward.ties) == (1, 3, 3)
    assert forward.p_value == backward.p_value == pytest.approx(10 / 16)  # 2 * (1 + 4) / 16
    assert forward.as_dict() == {"wins": 3, "losses": 1, "ties": 3, "p_value": forward.p_value}
    with pytest.raises(ValueError, match="differ in length"):
        sign_test([1], [1, 0])


def test_bootstrap_mean_interval_is_deterministic_and_within_the_range():
    from optimize.metrics import bootstrap_mean_interval

    scores = [1, 1, 0, -1, 1, 1, 0, 1, -1, 1]
    low, high = bootstrap_mean_interval(scores)
    assert bootstrap_mean_interval(scores) == (low, high)  # fixed seed: the same table every run
    assert -1 <= low < sum(scores) / len(scores) < high <= 1
    wide = bootstrap_mean_interval(scores, confidence=0.99)
    assert wide[0] <= low and high <= wide[1]
    assert bootstrap_mean_interval([1, 1, 1]) == (1.0, 1.0)  # nothing varies
    assert bootstrap_mean_interval([-1]) == (-1.0, -1.0)
    assert bootstrap_mean_interval([]) is None


def test_bootstrap_mean_interval_matches_the_normal_approximation_on_a_large_sample():
    from optimize.metrics import bootstrap_mean_interval

    # 400 questions, half +1 and half -1: mean 0, standard error 1/20, so about +-0.098.
    low, high = bootstrap_mean_interval([1, -1] * 200)
    assert low == pytest.approx(-0.098, abs=0.015) and high == pytest.approx(0.098, abs=0.015)


@pytest.mark.parametrize(
    ("citations", "evidence", "expected"),
    [
        ([{"doc_id": "pdf/x.pdf", "page": 3}], [{"doc_id": "pdf/x.pdf", "page": 3, "quote": "q"}], True),
        ([{"doc_id": "pdf/x.pdf", "page": 4}], [{"doc_id": "pdf/x.pdf", "page": 3}], False),  # wrong page
        ([{"doc_id": "pdf/x.pdf", "page": None}], [{"doc_id": "pdf/x.pdf", "page": 3}], False),
        ([{"doc_id": "pdf/x.pdf", "page": 7}], [{"doc_id": "pdf/x.pdf"}], True),  # evidence without a page
        ([{"doc_id": "pdf/x.pdf", "page": None}], [{"doc_id": "pdf/x.pdf", "page": None}], True),
        ([{"doc_id": "pdf/y.pdf", "page": 3}], [{"doc_id": "pdf/x.pdf", "page": 3}], False),  # wrong doc
        ([{"doc_id": "pdf/x.pdf", "page": 3}], [{"doc_id": "pdf/x.pdf", "page": "3"}], True),  # "3" is 3
        (  # any citation against any evidence
            [{"doc_id": "a", "page": 1}, {"doc_id": "pdf/x.pdf", "page": 2}],
            [{"doc_id": "b", "page": 1}, {"doc_id": "pdf/x.pdf", "page": 2}],
            True,
        ),
        ([], [{"doc_id": "pdf/x.pdf", "page": 3}], False),
        ([{"doc_id": "pdf/x.pdf", "page": 3}], [], False),
        ([{"doc_id": None, "page": None}], [{"page": 3}], False),  # evidence naming no document
    ],
)
def test_cites_evidence(citations, evidence, expected):
    from optimize.metrics import cites_evidence

    assert cites_evidence(citations, evidence) is expected


def test_cites_evidence_reads_citation_objects():
    from types import SimpleNamespace

    from optimize.metrics import cites_evidence

    cited = [SimpleNamespace(doc_id="pdf/x.pdf", page=3, quote="...")]  # like crag_dspy.citations.Citation
    assert cites_evidence(cited, [{"doc_id": "pdf/x.pdf", "page": 3}])
    assert not cites_evidence(cited, [{"doc_id": "pdf/x.pdf", "page": 2}])


def test_truthfulness_summary_counts_abstentions_hallucinations_and_the_breakdown():
    def row(correct, abstained, answerable):
        return {
            "correct": correct,
            "abstained": abstained,
            "answerable": answerable,
            "score": truthfulness_score(correct, abstained),
        }

    rows = [
        row(True, False, True),  # right
        row(False, True, True),  # "I don't know" to an answerable question: 0
        row(False, False, True),  # wrong: -1
        row(True, True, False),  # "I don't know" to an unanswerable question: right
    ]
    s = truthfulness_summary(rows)
    assert s["truthfulness"]["mean"] == pytest.approx(0.25)
    lo, hi = s["truthfulness"]["interval"]
    assert -1 <= lo <= 0.25 <= hi <= 1
    assert (s["abstained"]["n"], s["hallucination"]["n"]) == (2, 1)
    assert (s["answerable_right"]["n"], s["answerable_right"]["of"]) == (1, 3)
    assert (s["answerable_abstained"]["n"], s["unanswerable_abstained"]["n"]) == (1, 1)
    assert truthfulness_summary([])["truthfulness"] == {"mean": None, "interval": None}
