import pytest

from swarmrl.config import TaskConfig
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import Task
from swarmrl.tasks.sources.generated import addition, reverse_text


def _t(kind: str, answer: str) -> Task:
    return Task(problem_id="x", prompt="p", task_type=kind, verification_info={"answer": answer})


def test_reverse_text_similarity():
    t = _t("reverse_text", "olleh")
    assert verify(t, "olleh") == 1.0
    assert verify(t, " olleh\n") == 1.0  # surrounding whitespace ignored
    assert verify(t, "") == 0.0
    assert verify(t, "olle") == pytest.approx(1 - 1 / 5)  # one deletion
    assert verify(t, "hello") == pytest.approx(1 - 4 / 5)  # h-e-l-l-o vs o-l-l-e-h: 4 edits
    assert verify(t, "ol") == pytest.approx(1 - 3 / 5)  # short answers pay for every missing char
    assert verify(t, "ollehxxxxx") == pytest.approx(1 - 5 / 10)


def test_levenshtein():
    from swarmrl.tasks.graders.text import levenshtein

    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("abc", "abc") == 0


def test_addition_exact_last_integer():
    t = _t("addition", "579")
    assert verify(t, "579") == 1.0
    assert verify(t, "The answer is 579.") == 1.0
    assert verify(t, "578") == 0.0
    assert verify(t, "579 or maybe 580") == 0.0
    assert verify(t, "no number") == 0.0


def test_generated_tasks_verify_their_own_answers():
    cfg = TaskConfig(digits=3)
    for i in range(20):
        r, a = reverse_text(cfg, "train", i, 0), addition(cfg, "train", i, 0)
        assert verify(r, r.metadata["text"][::-1]) == 1.0
        assert verify(a, str(a.metadata["a"] + a.metadata["b"])) == 1.0
        assert 100 <= a.metadata["a"] <= 999
        assert cfg.min_len <= len(r.metadata["text"]) <= cfg.max_len


def test_generation_is_deterministic_and_splits_differ():
    cfg = TaskConfig()
    assert reverse_text(cfg, "train", 7, 0) == reverse_text(cfg, "train", 7, 0)
    train = {reverse_text(cfg, "train", i, 0).prompt for i in range(50)}
    held = {reverse_text(cfg, "eval", i, 0).prompt for i in range(50)}
    assert train != held


def test_unknown_task_type_is_named():
    with pytest.raises(KeyError, match="no verifier for task_type 'chess'"):
        verify(_t("chess", "e4"), "e4")
