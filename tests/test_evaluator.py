"""The trained evaluator: training, determinism, weights files, the grade source's choice and CRAG's use
of it. A tiny random encoder (conftest ``tiny_encoder``) keeps this fast; quality is measured on the real
MiniLM by ``benchmarks/grader_quality.py``."""

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, compile_report, field

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig, JudgeView
from crag_dspy.judges.evaluator import (
    EvaluatorError,
    RelevanceEvaluator,
    TrainingConfig,
    length_batches,
    train_evaluator,
    verify_folder,
    weights_manifest,
)
from crag_dspy.judges.fusion import Grading, LinearScore, fit_linear_score
from crag_dspy.program import ProgramError, apply_program, read_program, save_program
from crag_dspy.protocols import Passage
from optimize.grade_source import JudgeScores, choose_grade_source, distilled_pairs
from optimize.metrics import roc_auc

TESTS = Path(__file__).parent
# Every layer trains here: the tiny encoder has two, and frozen layers are tested on their own below.
FAST = TrainingConfig(
    learning_rate=1e-3, max_epochs=3, max_length=32, batch_size=16, threads=1, frozen_layers=0
)
WORDS = ["river", "mountain", "city", "lake", "forest", "bridge", "tower", "market", "harbor", "valley"]


def keyword_pairs(n: int, seed: int) -> list[tuple[str, str, int]]:
    """Pairs whose label is written in the passage ("yes"/"no"): learnable by a tiny model in seconds."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        word, label = rng.choice(WORDS), i % 2
        out.append(
            (f"what is the {word} {seed}-{i // 2}", f"the {word} answer {'yes' if label else 'no'}", label)
        )
    return out


@pytest.fixture(scope="module")
def trained(tiny_encoder):
    return train_evaluator(keyword_pairs(160, 1), keyword_pairs(40, 2), base=tiny_encoder, config=FAST)


def test_training_learns_ranks_heldout_pairs_and_reports_epochs(trained):
    evaluator, report = trained
    test = keyword_pairs(40, 3)
    logits = evaluator.logits([(q, p) for q, p, _ in test])
    pos = [x for x, (*_, y) in zip(logits, test) if y]
    neg = [x for x, (*_, y) in zip(logits, test) if not y]
    assert min(pos) > max(neg)
    assert report.train_pairs == 160 and report.holdout_pairs == 40
    assert 1 <= report.best_epoch <= len(report.epochs) <= FAST.max_epochs
    assert all(0 <= e["holdout_auc"] <= 1 for e in report.epochs)


def test_training_is_seeded_and_deterministic(tiny_encoder, trained):
    import torch

    threads = torch.get_num_threads()
    again, _ = train_evaluator(keyword_pairs(160, 1), keyword_pairs(40, 2), base=tiny_encoder, config=FAST)
    assert torch.get_num_threads() == threads  # FAST trains on 1 thread; the caller's setting is back
    pairs = [(q, p) for q, p, _ in keyword_pairs(10, 4)]
    assert again.logits(pairs) == trained[0].logits(pairs)
    assert again.fingerprint == trained[0].fingerprint


@pytest.mark.parametrize(
    "n, batch_size, windows", [(0, 4, 8), (1, 4, 8), (37, 4, 1), (37, 4, 3), (100, 16, 32)]
)
def test_length_batches_cover_every_pair_once_in_full_batches(n, batch_size, windows):
    lengths = [random.Random(i).randrange(5, 300) for i in range(n)]
    batches = length_batches(lengths, batch_size, windows, random.Random(7))
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert len(batches) == -(-n // batch_size) and all(1 <= len(b) <= batch_size for b in batches)
    assert batches == length_batches(lengths, batch_size, windows, random.Random(7))  # seeded


def test_length_batches_pad_less_than_shuffled_batches_and_one_window_is_a_plain_shuffle():
    lengths = [random.Random(i).randrange(20, 256) for i in range(640)]
    grouped = length_batches(lengths, 16, 32, random.Random(0))
    plain = length_batches(lengths, 16, 1, random.Random(0))
    order = list(range(640))
    random.Random(0).shuffle(order)
    assert [sorted(b) for b in plain] == [sorted(order[i : i + 16]) for i in range(0, 640, 16)]

    def padded(batches):  # tokens a batch costs: its size times its longest pair
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert padded(grouped) < 0.7 * padded(plain)
    longest = [max(lengths[i] for i in b) for b in grouped]
    assert longest != sorted(longest)  # the batches themselves are shuffled, not in length order


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_in_either_precision_learns_and_says_which(tiny_encoder, precision):
    config = FAST.model_copy(update={"precision": precision})
    evaluator, report = train_evaluator(
        keyword_pairs(160, 1), keyword_pairs(40, 2), base=tiny_encoder, config=config
    )
    assert report.precision == precision and report.as_dict()["precision"] == precision
    test = keyword_pairs(40, 3)
    logits = evaluator.logits([(q, p) for q, p, _ in test])
    assert roc_auc(logits, [y for *_, y in test]) > 0.9


def _tiny_folder(tmp_path: Path, model: object) -> Path:
    """A random encoder of another family with the bundled MiniLM's tokenizer."""
    import shutil

    from crag_dspy.embeddings import bundled_model_path

    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (bundled_model_path() / name).is_file():
            shutil.copy(bundled_model_path() / name, tmp_path / name)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path


def test_frozen_layers_keep_their_weights_while_the_layers_above_learn(tiny_encoder):
    import torch

    config = FAST.model_copy(
        update={"frozen_layers": 1, "learning_rate": 3e-3, "max_epochs": 6, "patience": 6}
    )
    evaluator, report = train_evaluator(
        keyword_pairs(160, 1), keyword_pairs(40, 2), base=tiny_encoder, config=config
    )
    assert report.frozen_layers == 1 and report.as_dict()["frozen_layers"] == 1
    losses = [e["train_loss"] for e in report.epochs]
    assert losses[-1] < losses[0] - 0.2  # the upper layer and head learn from the cached lower outputs
    untrained = RelevanceEvaluator.from_base(tiny_encoder, max_length=32, seed=config.seed).model.state_dict()
    trained_state = evaluator.model.state_dict()
    frozen = [k for k in untrained if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))]
    upper = [k for k in untrained if k.startswith("bert.encoder.layer.1.")]
    assert frozen and upper
    assert all(torch.equal(untrained[k], trained_state[k]) for k in frozen)
    assert not all(torch.equal(untrained[k], trained_state[k]) for k in upper)
    # The model is whole again: every layer, its embeddings, trainable as loaded.
    assert len(evaluator.model.bert.encoder.layer) == 2
    assert type(evaluator.model.bert.embeddings).__name__ == "BertEmbeddings"
    assert all(p.requires_grad for p in evaluator.model.parameters())
    again, _ = train_evaluator(keyword_pairs(160, 1), keyword_pairs(40, 2), base=tiny_encoder, config=config)
    assert again.fingerprint == evaluator.fingerprint


def test_frozen_layers_leave_at_least_one_layer_to_train(tiny_encoder):
    config = FAST.model_copy(update={"frozen_layers": 50})
    _, report = train_evaluator(keyword_pairs(40, 1), keyword_pairs(20, 2), base=tiny_encoder, config=config)
    assert report.frozen_layers == 1  # of the tiny encoder's 2


@pytest.mark.parametrize("family", ["albert", "electra"])
def test_an_encoder_whose_layers_cannot_run_apart_trains_whole(tmp_path, family):
    """ALBERT shares its layers (no ``encoder.layer``); ELECTRA projects its embeddings after them, so
    cached lower outputs would not reproduce it. Both train every layer, and the report says so."""
    import torch
    from transformers import AlbertConfig, AlbertModel, ElectraConfig, ElectraModel

    torch.manual_seed(0)
    sizes = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    sizes["intermediate_size"] = 64
    model = (
        AlbertModel(AlbertConfig(embedding_size=16, **sizes))
        if family == "albert"
        else ElectraModel(ElectraConfig(embedding_size=16, max_position_embeddings=128, **sizes))
    )
    folder = _tiny_folder(tmp_path, model)
    config = FAST.model_copy(update={"frozen_layers": 1})
    evaluator, report = train_evaluator(
        keyword_pairs(40, 1), keyword_pairs(20, 2), base=folder, config=config
    )
    assert report.frozen_layers == 0
    assert len(evaluator.logits([("a question", "a passage")])) == 1


def test_batched_logits_keep_the_callers_order(trained):
    evaluator, _ = trained
    pairs = [(q, p * (1 + i % 3)) for i, (q, p, _) in enumerate(keyword_pairs(12, 5))]  # mixed lengths
    one_by_one = [evaluator.logits([pair])[0] for pair in pairs]
    assert evaluator.logits(pairs, batch_size=5) == pytest.approx(one_by_one, abs=1e-5)


def test_one_class_training_data_is_refused(tiny_encoder):
    ones = [(q, p, 1) for q, p, _ in keyword_pairs(20, 1)]
    with pytest.raises(EvaluatorError, match="positive and negative"):
        train_evaluator(ones, keyword_pairs(10, 2), base=tiny_encoder, config=FAST)


def test_a_decoder_folder_is_not_a_base_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "is_decoder": True}))
    with pytest.raises(EvaluatorError, match="not a BERT-style encoder"):
        RelevanceEvaluator.from_base(tmp_path)
    with pytest.raises(EvaluatorError, match="no such model folder"):
        RelevanceEvaluator.from_base(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvaluatorError, match="no config.json"):
        RelevanceEvaluator.from_base(tmp_path / "empty")


def test_weights_verify_and_tampering_names_the_file(tmp_path, trained):
    folder = tmp_path / "w"
    manifest = trained[0].save(folder)
    assert "model.safetensors" in manifest and manifest == weights_manifest(folder)
    verify_folder(folder, manifest)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(EvaluatorError, match="model.safetensors: altered or foreign"):
        RelevanceEvaluator.load(folder, manifest)


def test_unlisted_pickle_or_missing_file_is_refused(tmp_path, trained):
    folder = tmp_path / "w"
    manifest = trained[0].save(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(EvaluatorError, match="pytorch_model.bin: a file the program does not list"):
        verify_folder(folder, manifest)
    (folder / "pytorch_model.bin").unlink()
    (folder / "config.json").unlink()
    with pytest.raises(EvaluatorError, match="config.json: missing"):
        verify_folder(folder, manifest)


def test_no_network_is_attempted(monkeypatch, tiny_encoder, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    evaluator, _ = train_evaluator(
        keyword_pairs(32, 1),
        keyword_pairs(8, 2),
        base=tiny_encoder,
        config=FAST.model_copy(update={"max_epochs": 1}),
    )
    manifest = evaluator.save(tmp_path / "w")
    RelevanceEvaluator.load(tmp_path / "w", manifest).logits([("q", "p")])


# -- the score maps ------------------------------------------------------------------------------
def test_linear_score_fit_orders_and_validates():
    rows = [{"evaluator": float(x)} for x in range(-5, 5)]
    score = fit_linear_score(rows, [0] * 5 + [1] * 5)
    assert score({"evaluator": 4.0}) > 0.5 > score({"evaluator": -5.0})
    assert LinearScore.from_dict(score.as_dict()) == score
    with pytest.raises(ValueError, match="2 positive and 2 negative"):
        fit_linear_score(rows[:3], [0, 0, 1])
    with pytest.raises(ValueError, match="signals"):
        LinearScore({"colour": 1.0}, 0.0)
    with pytest.raises(ValueError, match="were not given"):
        score({"llm": 1.0})


def test_grading_state_refuses_incomplete_modes_and_paths():
    with pytest.raises(ValueError, match="needs a trained evaluator"):
        Grading().load_state({"mode": "evaluator", "evaluator": None, "evaluator_score": None})
    with pytest.raises(ValueError, match="unknown grade mode"):
        Grading().use("oracle")
    bad = {"path": "../elsewhere", "files": {}}
    with pytest.raises(ValueError, match="a name beside the program file"):
        Grading().load_state({"mode": "llm", "evaluator": bad})


# -- choosing the grade source ---------------------------------------------------------------------
class _Crag:
    def __init__(self):
        self.grading = Grading()


def _examples(pairs):
    return [
        dspy.Example(question=q, document=p, relevant=bool(y)).with_inputs("question", "document")
        for q, p, y in pairs
    ]


def _choose(tiny_encoder, embedder, llm_val, *, train_n=240, choice="auto", invert_val=False):
    train = _examples(keyword_pairs(train_n, 1))
    val = _examples([(q, p, 1 - y if invert_val else y) for q, p, y in keyword_pairs(40, 5)])
    held_out = train[:40]
    rng = random.Random(0)
    llm = JudgeScores(
        val=llm_val(val),
        held_out=held_out,
        held_out_scores=[
            min(max(0.5 + (0.3 if e.relevant else -0.3) + rng.uniform(-0.4, 0.4), 0.01), 0.99)
            for e in held_out
        ],
        uncompiled_val=llm_val(val),
    )
    crag = _Crag()
    result = choose_grade_source(
        crag,
        train,
        val,
        llm,
        choice=choice,
        base=tiny_encoder,
        config=FAST,
        embedder=embedder,
        progress=False,
    ).report
    return crag, result


def test_evaluator_ships_when_it_beats_the_llm_on_val(tiny_encoder, embedder):
    coin = random.Random(1)
    crag, result = _choose(tiny_encoder, embedder, lambda val: [coin.random() for _ in val])
    assert result["candidates"]["evaluator"]["accuracy"] == 1.0
    assert result["shipped"] in ("evaluator", "fused") and crag.grading.mode == result["shipped"]
    assert crag.grading.evaluator is not None
    low, high = result["candidates"]["evaluator"]["accuracy_ci"]
    assert low < 1.0 == high  # Wilson interval of 40/40


@pytest.mark.parametrize("frozen", [0, 3])
def test_the_compile_report_says_how_the_evaluator_was_trained(tmp_path, frozen):
    from optimize.report import write_report

    training = {
        "train_pairs": 200,
        "holdout_pairs": 40,
        "best_epoch": 2,
        "seconds": 12.0,
        "frozen_layers": frozen,
    }
    training["epochs"] = [{"epoch": 1, "holdout_auc": 0.7}, {"epoch": 2, "holdout_auc": 0.8}]
    measured = {"accuracy": 0.8, "accuracy_ci": [0.7, 0.9], "precision": 0.8, "recall": 0.8, "roc_auc": 0.85}
    report = compile_report(
        stages={
            "grade_source": {
                "shipped": "evaluator",
                "why": "highest val accuracy",
                "candidates": {"evaluator": measured},
                "training": training,
            }
        }
    )
    _, md = write_report(report, tmp_path / "program.json")
    text = md.read_text()
    layers = "the lowest 3 encoder layers frozen" if frozen else "every layer trained"
    assert f"fine-tuned on 200 train pairs ({layers}), epoch chosen on 40 pairs" in text
    assert "held-out AUC by epoch 1: 0.700, 2: 0.800; kept epoch 2); 12 s." in text
    assert "Distillation" not in text
    distillation = {
        "questions": 9,
        "combinations": 45,
        "pairs": 44,
        "relevant": 7,
        "failed": 1,
        "seconds": 20.4,
        "held_out_auc_with": 0.91,
        "held_out_auc_without": 0.55,
        "kept": bool(frozen),
    }
    report["stages"]["grade_source"]["distillation"] = distillation
    _, md = write_report(report, tmp_path / "program.json")
    verdict = "kept" if frozen else "not kept: the evaluator above is trained on labelled pairs alone"
    assert (
        "Distillation: the LLM judge labelled 44 passages (7 relevant) among the top-k no label covers of 9 "
        "train questions (45 passages, 1 the judge failed on; 20 s). Trained with them too, the evaluator "
        f"ranks the held-out pairs at AUC 0.910 against 0.550 without: {verdict}."
    ) in md.read_text()


def test_llm_is_kept_when_it_is_better_on_val(tiny_encoder, embedder):
    # On val the passages' "yes"/"no" lie (labels inverted): the evaluator learned them from train and is
    # wrong there, the LLM judge is right. The LLM judge must ship, and a forced evaluator is reported.
    perfect = lambda val: [0.9 if e.relevant else 0.1 for e in val]
    crag, result = _choose(tiny_encoder, embedder, perfect, invert_val=True)
    assert result["candidates"]["evaluator"]["accuracy"] < 0.5 <= result["candidates"]["llm"]["accuracy"]
    assert result["shipped"] == "llm" and crag.grading.mode == "llm" and crag.grading.evaluator is None
    _, forced = _choose(tiny_encoder, embedder, perfect, invert_val=True, choice="evaluator")
    assert forced["shipped"] == "evaluator" and "below the uncompiled LLM judge" in forced["why"]
    _, asked = _choose(tiny_encoder, embedder, perfect, choice="llm")
    assert asked["shipped"] == "llm" and "evaluator" not in asked["candidates"]


def _keyword_judge(system, user):
    """The LLM judge of a keyword world: a passage is relevant when it says "yes"; "unsure" is no answer."""
    if "You judge search results" not in system:
        raise AssertionError(f"unexpected prompt: {system[:60]}")
    document = field(user, "document")
    return "unsure" if "unsure" in document else (0.9 if "yes" in document else 0.1)


def test_distilled_pairs_are_the_llm_judges_labels_on_the_top_k_no_label_covers(embedder, trained):
    retriever = ListRetriever(
        [
            ("a", "the river answer yes"),
            ("b", "the lake answer no"),
            ("c", "the city answer unsure"),
            ("d", "beyond k"),
        ]
    )
    lm = ScriptedLM(_keyword_judge)
    crag = CRAG(retriever, ListWebSearch(), CRAGConfig(k=3, grader_view=JudgeView(sentences=0)), lm=lm)
    crag.grading.use("evaluator", trained[0], LinearScore({"evaluator": 1.0}, 0.0))  # the teacher is the LLM
    with dspy.context(lm=lm):
        pairs, info = distilled_pairs(
            crag, ["q1", "q2", "q1"], {("q1", "the river answer yes")}, embedder, progress=False
        )
    assert pairs == [
        ("q1", "the lake answer no", 0),
        ("q2", "the river answer yes", 1),
        ("q2", "the lake answer no", 0),
    ]  # the labelled pair and the passages beyond k are not asked; a failed judgement is no label
    assert {k: info[k] for k in ("questions", "combinations", "pairs", "relevant", "failed")} == {
        "questions": 2,
        "combinations": 5,
        "pairs": 3,
        "relevant": 1,
        "failed": 2,
    }
    assert crag.grading.mode == "llm"
    asked = [field(user, "document") for _, user in lm.calls]
    assert "beyond k" not in asked and asked.count("the river answer yes") == 1


class _QuestionRetriever:
    """Each question's own passages: unlabelled ones the LLM judge may label."""

    def __init__(self, passages: dict[str, list[str]]):
        self.passages = passages

    def retrieve(self, query: str, k: int) -> list[Passage]:
        texts = self.passages.get(query, [])[:k]
        return [
            Passage(id=f"{query}-{i}", doc_id=query, title=query, text=x, rank=i, similarity=0.5)
            for i, x in enumerate(texts)
        ]


def _distil(tiny_encoder, embedder, *, noisy_train: bool, judge):
    """choose_grade_source with distillation on 100 fresh questions plus a held-out one; with
    ``noisy_train`` the labelled pairs outside the held-out questions carry random labels."""
    noise = random.Random(3)
    train = _examples(keyword_pairs(240, 1))
    held_out = train[:40]
    held_questions = {e.question for e in held_out}
    if noisy_train:
        for e in train:
            if e.question not in held_questions:
                e.relevant = noise.random() < 0.5
    val = _examples(keyword_pairs(40, 5))
    fresh = {
        f"which {word} is fresh {i}": [f"the {word} answer yes", f"the {word} answer no"]
        for i, word in enumerate(WORDS * 10)
    }
    fresh[held_out[0].question] = ["the river answer yes"]
    lm = ScriptedLM(judge)
    crag = CRAG(
        _QuestionRetriever(fresh),
        ListWebSearch(),
        CRAGConfig(k=2, grader_view=JudgeView(sentences=0)),
        lm=lm,
    )
    llm = JudgeScores(
        val=[0.9 if e.relevant else 0.1 for e in val],
        held_out=held_out,
        held_out_scores=[0.8 if e.relevant else 0.2 for e in held_out],
        uncompiled_val=[0.9 if e.relevant else 0.1 for e in val],
    )
    with dspy.context(lm=lm):
        result = choose_grade_source(
            crag,
            train,
            val,
            llm,
            choice="evaluator",
            base=tiny_encoder,
            config=FAST,
            embedder=embedder,
            distill=list(fresh),
            progress=False,
        ).report
    fit = sum(e.question not in held_questions for e in train)
    return crag, lm, result, fit


def test_distilled_labels_train_the_evaluator_when_they_rank_held_out_pairs_better(tiny_encoder, embedder):
    # The labelled pairs outside the held-out questions are noise; the LLM judge reads the keyword right.
    crag, lm, result, fit = _distil(tiny_encoder, embedder, noisy_train=True, judge=_keyword_judge)
    d = result["distillation"]
    assert d["questions"] == 100 and d["pairs"] == 200 and d["relevant"] == 100  # not the held-out question
    assert len(lm.calls) == 200  # only the distilled passages: the judge's val and held-out scores are given
    assert d["held_out_auc_with"] > d["held_out_auc_without"] and d["kept"] is True
    assert result["training"]["train_pairs"] == fit + 200
    assert result["shipped"] == "evaluator" and crag.grading.mode == "evaluator"


def test_a_teacher_that_ranks_held_out_pairs_worse_is_not_kept(tiny_encoder, embedder):
    def lying(system, user):  # says the opposite of the keyword
        return 1.0 - _keyword_judge(system, user)

    _, _, result, fit = _distil(tiny_encoder, embedder, noisy_train=False, judge=lying)
    d = result["distillation"]
    assert d["pairs"] == 200 and d["relevant"] == 100
    assert d["held_out_auc_with"] <= d["held_out_auc_without"] and d["kept"] is False
    assert result["training"]["train_pairs"] == fit  # the evaluator trained on labelled pairs alone ships


def test_too_few_pairs_keep_the_llm_and_say_why(tiny_encoder, embedder):
    _, result = _choose(tiny_encoder, embedder, lambda val: [0.5 for _ in val], train_n=60)
    assert result["shipped"] == "llm" and "too few labelled train pairs" in result["why"]
    with pytest.raises(ValueError, match="--grader evaluator: too few"):
        _choose(tiny_encoder, embedder, lambda val: [0.5 for _ in val], train_n=60, choice="evaluator")


# -- CRAG with an evaluator -----------------------------------------------------------------------
def _evaluator_crag(evaluator, mode="evaluator", lm=None):
    crag = CRAG(
        ListRetriever([("kb-yes", "the river answer yes"), ("kb-no", "the river answer no")]),
        ListWebSearch(),
        CRAGConfig(grader_view=JudgeView(sentences=0)),
        lm=lm or ScriptedLM(_script),
    )
    fused = LinearScore({"llm": 0.5, "evaluator": 1.0, "similarity": 0.1}, 0.0) if mode == "fused" else None
    crag.grading.use(mode, evaluator, LinearScore({"evaluator": 1.0}, 0.0), fused)
    return crag


def _script(system, user):
    if "You judge search results" in system:
        return 0.9 if "yes" in field(user, "document") else 0.1
    if "You judge short knowledge strips" in system:
        return 0.9
    if "Answer the question" in system:
        return {"answer": "yes"}
    return {"query": "river"}


def test_evaluator_grades_without_llm_calls_and_the_trace_says_so(trained):
    lm = ScriptedLM(_script)
    crag = _evaluator_crag(trained[0], lm=lm)
    pred = crag(question="what is the river")
    graders = [s for s, _ in lm.calls if "You judge search results" in s]
    assert graders == []
    docs = pred.trace.documents
    assert [d.score_source for d in docs] == ["evaluator", "evaluator"]
    assert docs[0].score > docs[1].score and docs[0].attempts == 0 and "evaluator" in docs[0].signals


def test_fused_grade_falls_back_to_the_evaluator_when_the_llm_fails(trained):
    def failing(system, user):
        if "You judge search results" in system:
            return "maybe"  # unparseable: the judge fails after its retries
        return _script(system, user)

    crag = _evaluator_crag(trained[0], "fused", ScriptedLM(failing))
    pred = crag(question="what is the river")
    assert {d.score_source for d in pred.trace.documents} == {"evaluator"}
    assert any("graded by the trained evaluator alone" in f for f in pred.trace.fallbacks)
    ok = _evaluator_crag(trained[0], "fused")(question="what is the river")
    assert {d.score_source for d in ok.trace.documents} == {"fused"}
    assert set(ok.trace.documents[0].signals) == {"llm", "evaluator", "similarity"}


def test_program_with_evaluator_round_trips_across_processes(tmp_path, trained):
    crag = _evaluator_crag(trained[0])
    path = save_program(crag, tmp_path / "program.json", {"domain": "default"})
    doc = json.loads(path.read_text())
    manifest = doc["grading"]["evaluator"]
    assert manifest["path"] == "program.evaluator" and "model.safetensors" in manifest["files"]
    assert (tmp_path / "program.evaluator" / "model.safetensors").is_file()
    here = [d.score for d in crag(question="what is the river").trace.documents]
    code = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
from test_evaluator import _evaluator_crag
from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig, JudgeView
from fakes import ListRetriever, ListWebSearch, ScriptedLM
from test_evaluator import _script
from crag_dspy.program import apply_program, read_program
crag = CRAG(ListRetriever([("kb-yes", "the river answer yes"), ("kb-no", "the river answer no")]),
            ListWebSearch(), CRAGConfig(grader_view=JudgeView(sentences=0)), lm=ScriptedLM(_script))
apply_program(crag, read_program({str(path)!r}), {str(tmp_path)!r})
pred = crag(question="what is the river")
print(json.dumps([[d.score for d in pred.trace.documents], pred.action]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    scores, action = json.loads(out.stdout.strip().splitlines()[-1])
    assert scores == pytest.approx(here, abs=1e-6)
    assert action == crag(question="what is the river").action


def test_tampered_program_weights_are_refused_and_nothing_is_applied(tmp_path, trained):
    path = save_program(_evaluator_crag(trained[0]), tmp_path / "program.json", {"domain": "default"})
    weights = tmp_path / "program.evaluator" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\x00" * 8)
    target = CRAG(
        ListRetriever([]),
        ListWebSearch(),
        CRAGConfig(lower=0.11, upper=0.88, grader_view=JudgeView(sentences=0)),
    )
    with pytest.raises(ProgramError, match="model.safetensors: altered or foreign"):
        apply_program(target, read_program(path), tmp_path)
    assert target.grading.mode == "llm" and target.thresholds.lower == 0.11
    with pytest.raises(ProgramError, match="load it from its file"):
        apply_program(target, read_program(path))


def test_ask_output_names_the_grade_source(trained):
    from crag_dspy.cli import format_trace

    pred = _evaluator_crag(trained[0])(question="what is the river")
    assert "documents (graded by the trained evaluator):" in format_trace(pred.trace)


def test_the_benchmarks_grades_are_the_programs_grades(trained, embedder):
    from optimize.grade_source import program_grades

    lm = ScriptedLM(_script)
    crag = _evaluator_crag(trained[0], lm=lm)
    in_program = [d.score for d in crag(question="what is the river").trace.documents]
    examples = _examples(
        [("what is the river", "the river answer yes", 1), ("what is the river", "the river answer no", 0)]
    )
    calls = len(lm.calls)
    # ListRetriever's passages are displayed with their doc id as title: grade the same text.
    examples = [e.copy(document=f"kb-{'yes' if e.relevant else 'no'}\n{e.document}") for e in examples]
    assert program_grades(crag, examples, embedder, progress=False) == pytest.approx(in_program, abs=1e-6)
    assert len(lm.calls) == calls  # the evaluator grades without the LM


POPQA = TESTS.parents[1] / "shared" / "data" / "popqa-dev"


@pytest.mark.skipif(not POPQA.is_dir(), reason="../shared/data/popqa-dev is not present")
def test_popqa_dev_pairs_train_an_evaluator_by_path(tiny_encoder):
    """Real text in the domain format, read where it lies (never copied into the project)."""
    from crag_dspy.domain import load_domain
    from optimize.datasets import relevance_examples

    domain = load_domain(POPQA)
    train = relevance_examples(domain.relevance, "train")
    assert len(train) >= 100 and 0 < sum(e.relevant for e in train) < len(train)
    pairs = [(e.question, e.document, int(e.relevant)) for e in train[:48]]
    evaluator, report = train_evaluator(
        pairs[:32], pairs[32:], base=tiny_encoder, config=FAST.model_copy(update={"max_epochs": 1})
    )
    assert report.train_pairs == 32 and len(evaluator.logits([(q, p) for q, p, _ in pairs[:4]])) == 4


def test_a_rerun_on_the_same_pairs_reuses_the_cached_training(tiny_encoder, tmp_path):
    from optimize.grade_source import trained_evaluator

    train, holdout = keyword_pairs(48, 1), keyword_pairs(16, 2)
    kwargs = {"base": tiny_encoder, "config": FAST, "cache_dir": tmp_path, "progress": False}
    first, info = trained_evaluator(train, holdout, **kwargs)
    again, cached = trained_evaluator(train, holdout, **kwargs)
    assert not info["cached"] and cached["cached"] and again.fingerprint == first.fingerprint
    assert cached["epochs"] == info["epochs"]
    _, fresh = trained_evaluator(train[:-2], holdout, **kwargs)  # other pairs: trained anew
    assert not fresh["cached"]


def test_a_training_cached_under_another_torch_version_is_not_reused(tiny_encoder, tmp_path, monkeypatch):
    import importlib.metadata

    from optimize.grade_source import trained_evaluator

    train, holdout = keyword_pairs(48, 1), keyword_pairs(16, 2)
    kwargs = {"base": tiny_encoder, "config": FAST, "cache_dir": tmp_path, "progress": False}
    _, first = trained_evaluator(train, holdout, **kwargs)
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "0.0.1-other" if name == "torch" else real_version(name),
    )
    _, upgraded = trained_evaluator(train, holdout, **kwargs)
    assert not first["cached"] and not upgraded["cached"]
    assert len(list(tmp_path.iterdir())) == 2  # both trainings kept, each under its own versions
