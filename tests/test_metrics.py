import pytest

from optimize.metrics import answer_matches, binary_report, normalize_answer, roc_auc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,240 Velds.", "1240 velds"),
        ("The  AquaProbe-220", "aquaprobe 220"),
        ("an answer", "answer"),
        ("90%", "90%"),
        ("I don’t know", "i don t know"),
        ("ＩＰ６８", "ip68"),
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
