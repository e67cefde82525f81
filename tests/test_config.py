"""CRAGConfig: one frozen, validated config with one default per setting, from code, env or a domain."""

import doctest

import pytest
from fakes import ListRetriever, ListWebSearch
from pydantic import ValidationError

import crag_dspy.config
from crag_dspy import CRAG, CRAGConfig, Settings
from crag_dspy.domain import DomainConfig


def test_the_modules_examples_run():
    assert doctest.testmod(crag_dspy.config).failed == 0


def test_config_is_frozen_and_replace_validates():
    config = CRAGConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.k = 3
    assert config.replace(k=3).k == 3 and config.k == 5
    assert config.replace(grader_view={"sentences": 0}).grader_view.sentences == 0
    with pytest.raises(ValidationError, match="must not exceed upper"):
        config.replace(lower=0.8)
    with pytest.raises(ValidationError, match="extra"):
        CRAGConfig(fallback_web_strips=1)  # a removed setting is an error, not silently ignored


def test_settings_embed_it_and_read_nested_environment_variables(monkeypatch):
    monkeypatch.setenv("CRAG_CONFIG__K", "8")
    monkeypatch.setenv("CRAG_CONFIG__GRADER_VIEW__SENTENCES", "0")
    monkeypatch.setenv("CRAG_CONFIG__LM_CALLS__USE_LOGPROBS", "false")
    config = Settings().config
    assert (config.k, config.grader_view.sentences, config.lm_calls.use_logprobs) == (8, 0, False)
    monkeypatch.setenv("CRAG_CONFIG__UPPER", "0.1")
    with pytest.raises(ValidationError, match="must not exceed upper"):
        Settings()


def test_a_domain_fixes_only_what_its_toml_sets():
    config = CRAGConfig(k=9, sentences_per_strip=4)
    assert DomainConfig(name="abc").crag_config(config) == config
    fixed = DomainConfig(name="abc", k=3, sentences_per_strip=2).crag_config(config)
    assert (fixed.k, fixed.sentences_per_strip) == (3, 2)


def test_crag_runs_with_its_config():
    crag = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.2, upper=0.6, lm_calls={"retries": 0}))
    assert (crag.thresholds.lower, crag.thresholds.upper) == (0.2, 0.6)
    assert crag.grader.retries == crag.strip_filter.retries == 0
    assert crag.grader.view is not None and crag.grader.view.sentences == 1
    crag.config = crag.config.replace(grader_view={"sentences": 0}, upper=0.9)
    assert crag.grader.view is None and crag.thresholds.upper == 0.9


def test_a_moved_or_misspelt_setting_is_never_silently_ignored(monkeypatch, caplog):
    with pytest.raises(TypeError, match=r"unknown settings \['k'\].*CRAG_CONFIG__K"):
        Settings(k=3)
    monkeypatch.setenv("CRAG_GRADE_SENTENCES", "0")
    with caplog.at_level("WARNING", logger="crag_dspy.settings"):
        Settings()
    assert "CRAG_GRADE_SENTENCES" in caplog.text


def test_the_judges_can_be_injected_and_the_config_still_drives_them():
    from fakes import ScriptedLM, field

    from crag_dspy.judges.llm import BinaryJudge
    from signatures import GradeDocument

    strict = BinaryJudge(GradeDocument.with_instructions("You judge search results strictly."))
    seen = []

    def script(system, user):
        if "You judge search results strictly." in system:
            seen.append(field(user, "document"))
            return 0.9
        if "You judge short knowledge strips" in system:
            return 0.9
        return {"answer": "fine"}

    config = CRAGConfig(grader_view={"sentences": 0}, lm_calls={"retries": 0})
    crag = CRAG(
        ListRetriever([("kb-1", "A fact.")]), ListWebSearch(), config, lm=ScriptedLM(script), grader=strict
    )
    assert crag.grader is strict and strict.retries == 0 and strict.view is None
    assert crag(question="What is it?").action == "CORRECT" and seen == ["kb-1\nA fact."]  # the whole passage
    assert "grader.predict" in dict(crag.named_predictors())  # the compile tunes the injected judge


TIMEOUTS = [
    "lm_timeout_s",
    "store_timeout_s",
    "web_timeout_s",
    "request_timeout_s",
    "serve_header_timeout_s",
    "serve_body_timeout_s",
]


@pytest.mark.parametrize("name", TIMEOUTS)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inf", "finite number"),
        ("1e309", "finite number"),  # overflows to inf
        ("nan", "finite number"),
        ("-5", "greater than 0"),
        ("0", "greater than 0"),
        ("1e6", "less than or equal to 86400"),
    ],
)
def test_a_timeout_is_a_finite_number_of_seconds_up_to_a_day(name, value, message, monkeypatch):
    monkeypatch.setenv(f"CRAG_{name.upper()}", value)
    with pytest.raises(ValidationError, match=f"{name}\n.*{message}"):
        Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("embedded_threads", "100000"),
        ("embedded_ctx", "100000000"),
        ("max_question_chars", "10000000"),
        ("max_body_bytes", "100000000000"),
        ("serve_workers", "100000"),
        ("serve_queue", "10000000"),
        ("serve_max_waiting_connections", "10000000"),
        ("config__max_strips", "100000"),
        ("config__sentences_per_strip", "100000"),
        ("config__grader_view__sentences", "100000"),
    ],
)
def test_sizes_and_counts_have_an_upper_bound(name, value, monkeypatch):
    monkeypatch.setenv(f"CRAG_{name.upper()}", value)
    with pytest.raises(ValidationError, match="less than or equal to"):
        Settings()
