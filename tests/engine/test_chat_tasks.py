"""The tasks' chat form: each question asks the compact prompt's problem in words, and each extractor takes the
answer out of a reply the way a chat model writes it (engine/tasks.py documents the rules) — tried on right, wrong,
rambling and hostile replies. The exact checkers then judge what was extracted."""

import random

import pytest

from divviz.engine.tasks import held_out_prompts, TASKS

ADD = "12+13="  # reference "25"
SHAPES = [  # (task, compact prompt, reply, what the extractor gives, correct?)
    ("add", ADD, "25", "25", True),
    ("add", ADD, "12 + 13 = 25", "25", True),
    ("add", ADD, "The answer is 25.", "25", True),
    ("add", ADD, "**25**", "25", True),
    ("add", ADD, "12 + 13 = 25\n\nThis is because 10 + 10 = 20 and 2 + 3 = 5.", "25", True),
    ("add", ADD, "Sure! 12 plus 13 equals 25", "25", True),
    ("add", ADD, "12 + 13 = 24", "24", False),
    ("add", ADD, "The sum is twenty-five.", None, False),
    ("add", ADD, "", None, False),
    ("add", ADD, "2.5", None, False),
    ("add", ADD, "25.0", None, False),
    ("add", ADD, "-25", "-25", False),
    ("add", ADD, "1,025", "1025", False),
    ("add", ADD, "<script>alert(25)</script>", "25", True),  # text, never run: the number is what counts
    ("add", ADD, "Let me think.\n\n25", None, False),  # the answer must be in the first paragraph
    ("add", ADD, "25 " * 2000, "25", True),
    ("sort", "sort:3142=", "1234", "1234", True),
    ("sort", "sort:3142=", "1, 2, 3, 4", "1234", True),
    ("sort", "sort:3142=", "The sorted digits are 1 2 3 4.", "1234", True),
    ("sort", "sort:3142=", "3142 sorted: 1234", "1234", True),
    ("sort", "sort:3142=", "4321", "4321", False),
    ("sort", "sort:3142=", "one two three four", None, False),
    ("reverse", "rev:abcd=", "dcba", "dcba", True),
    ("reverse", "rev:abcd=", "The reversed word is 'dcba'.", "dcba", True),
    ("reverse", "rev:abcd=", "Reversed: **DCBA**", "dcba", True),
    ("reverse", "rev:abcd=", "The reverse of abcd is dcba", "dcba", True),
    ("reverse", "rev:abcd=", "`dcba` is abcd backwards", "dcba", True),
    ("reverse", "rev:abcd=", "abcd", "abcd", False),
    ("reverse", "rev:abcd=", "12345", None, False),
    ("countdown", "cd:3,5,7>22=", "3*5+7", "3*5+7", True),
    ("countdown", "cd:3,5,7>22=", "3 × 5 + 7 = 22", "3*5+7", True),
    ("countdown", "cd:3,5,7>22=", "We can do 3 x 5 + 7 = 22.", "3*5+7", True),
    ("countdown", "cd:3,5,7>22=", "(7 + 5) * 3 = 36", "(7+5)*3", False),
    ("countdown", "cd:3,5,7>22=", "3*5+7+7", "3*5+7+7", False),  # 7 used twice
    ("countdown", "cd:3,5,7>22=", "22", None, False),
    ("countdown", "cd:3,5,7>22=", "__import__('os').system('x')", None, False),
]


@pytest.mark.parametrize("task,prompt,reply,extracted,correct", SHAPES)
def test_each_extractor_on_answer_shapes(task, prompt, reply, extracted, correct):
    t = TASKS[task]
    answers = {"add": "25", "sort": "1234", "reverse": "dcba", "countdown": "3*5+7"}  # countdown's checker reads the
    # prompt: any expression over its numbers that reaches the target is right
    assert t.extract(reply) == extracted
    assert t.is_correct(prompt, answers[task], reply, chat=True) is correct
    assert t.reward(prompt, answers[task], reply, chat=True) == (1.0 if correct else 0.0)


def test_a_wrong_but_well_formed_reply_earns_the_format_reward_in_either_form():
    add = TASKS["add"]
    assert add.reward(ADD, "25", "12 + 13 = 24", format_reward=0.2, chat=True) == 0.2
    assert add.reward(ADD, "25", "no idea", format_reward=0.2, chat=True) == 0.0
    assert add.reward(ADD, "25", "24", format_reward=0.2) == 0.2 and add.reward(ADD, "25", "25") == 1.0
    assert add.reward(ADD, "25", "12 + 13 = 25") == 0.0  # the compact form judges the whole completion


@pytest.mark.parametrize("name", list(TASKS))
def test_questions_ask_the_same_problem_and_the_reference_answer_passes(name):
    """Same seed, same problems and references in both forms; the reference, written as a chat model would, is
    extracted and judged correct."""
    task = TASKS[name]
    for prompt, reference in task.batch(seed=5, n=50):
        question = task.question(prompt)
        assert question.endswith(".") and "Reply with only" in question
        assert task.is_correct(prompt, reference, f"Sure.  The answer is {reference}", chat=True) or name == "reverse"
        assert task.is_correct(prompt, reference, f"**{reference}**\n\nHope this helps!", chat=True)
    assert TASKS["add"].question("17+8=") == "What is 17 + 8? Reply with only the number."
    drawn = [task.make(r) for r in [random.Random(5)] for _ in range(20)]  # the seed's problems, the held-out skipped
    assert task.batch(seed=5, n=3) == [p for p in drawn if p[0] not in held_out_prompts(task.name)][:3]
