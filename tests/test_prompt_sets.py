"""Every task has a prompt set (at least three prompts), in the spirit of its first one, and the perturbation probe
variants differ from their base prompt by one phrase."""

from __future__ import annotations

import difflib
import re

import pytest

from harness import MANIFESTS

TASKS = ("zh-prose", "en-prose", "code-gen", "code-edit", "json-out", "reasoning", "translate", "long-ctx")
FOLDER = MANIFESTS / "tasks"
CJK = re.compile(r"[\u4e00-\u9fff]")


def _set(task: str) -> list[str]:
    return [FOLDER / f"{task}.md"] + sorted(FOLDER.glob(f"{task}-[0-9].md"))


@pytest.mark.parametrize("task", TASKS)
def test_each_task_has_at_least_three_distinct_prompts(task):
    texts = [p.read_text(encoding="utf-8") for p in _set(task)]
    assert len(texts) >= 3 and len(set(texts)) == len(texts)
    first = len(texts[0])
    for t in texts[1:]:
        assert t.endswith("\n") and not t.startswith(" ")
        # similar length to the task's first prompt (the long documents may be shorter, still long)
        low = 0.5 if task != "long-ctx" else 0.4
        assert low * first <= len(t) <= 2.5 * first, (task, len(t), first)


@pytest.mark.parametrize("task", ("zh-prose", "translate"))
def test_chinese_tasks_involve_chinese(task):
    texts = {p.name: p.read_text(encoding="utf-8") for p in _set(task)}
    chinese = [n for n, t in texts.items() if CJK.search(t) or "Simplified Chinese" in t]
    assert len(chinese) >= 2, chinese
    if task == "zh-prose":
        assert all(len(CJK.findall(t)) > 100 for t in texts.values())


def test_long_documents_are_thousands_of_words_with_the_instruction_last():
    for p in _set("long-ctx"):
        text = p.read_text(encoding="utf-8")
        assert len(text.split()) >= 1500, p.name
        assert text.rstrip().split("\n---\n")[-1].strip().startswith(("Summarize", "Write a summary")), p.name


def test_probe_variants_change_one_phrase_of_the_base_prompt():
    base = (FOLDER / "en-prose.md").read_text(encoding="utf-8")
    probes = sorted(FOLDER.glob("en-prose-probe-*.md"))
    assert len(probes) >= 2
    for p in probes:
        variant = p.read_text(encoding="utf-8")
        ops = [op for op in difflib.SequenceMatcher(None, base, variant, autojunk=False).get_opcodes()
               if op[0] != "equal"]
        assert len(ops) in (1, 2), (p.name, ops)  # one insertion or deletion (a replace may split in two)
    assert "Do not answer with an outline." in (FOLDER / "en-prose-probe-no-outline.md").read_text(encoding="utf-8")
