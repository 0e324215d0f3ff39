"""Synthetic tasks with verifiable rewards, generated from a seed, checked exactly.

Each task makes (prompt, answer) pairs and scores a completion: reward 1 if the completion (up to the
end-of-sequence token) is a correct answer, else 0; with `format_reward` > 0, a wrong but well-formed
answer (only the characters the answer may contain) earns that much. Each task keeps a fixed held-out set of
`HELD_OUT` problems (`Task.held_out`) that its training batches never contain, for the evaluation during training.

    add        "17+8="         → "25"
    sort       "sort:3142="    → "1234"
    reverse    "rev:abcd="     → "dcba"
    countdown  "cd:3,5,7>22="  → any expression over the given numbers (each at most once) with + − * and
                                 parentheses that evaluates to the target, e.g. "3*5+7" (parsed, never eval'd)

Each task also has a chat form for a pretrained chat model: the same problem (same seed, same reference answer)
asked in words (`question`), and an extractor (`extract`) that takes the answer out of a reply the way such a model
writes it; the exact checker then judges the extracted answer. Extractors read the reply's first paragraph (the text
before the first blank line), so a model that answers and then rambles is judged on its answer:

    add        the last integer                "12 + 13 = 25" → "25";  "**25**" → "25"
    sort       the last run of digits, which may be separated by spaces or commas   "1, 2, 3, 4" → "1234"
    reverse    the last quoted, bold or backticked word, else the last word (lower-cased)   "It is 'dcba'." → "dcba"
    countdown  the last expression (digits, + - * × x and parentheses, with an operator), its left side if it is
               written as an equation                                               "3 × 5 + 7 = 22" → "3*5+7"
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Callable

from divviz.catalogue.params import DivvizInputError
from divviz.safetext import unknown

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz+-*=:,>() "


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    make: Callable[[random.Random], tuple[str, str]]  # rng -> (prompt, reference answer)
    correct: Callable[[str, str, str], bool]  # (prompt, reference, completion) -> bool
    answer_chars: str  # characters a well-formed answer may use
    max_answer_len: int
    question: Callable[[str], str]  # the compact prompt asked in words, for a chat model
    extract: Callable[[str], str | None]  # a chat reply -> the answer it gives (None: it gives none)

    def answer(self, completion: str, chat: bool) -> str | None:
        """The answer a completion gives: the whole completion (compact prompts), or what `extract` finds (chat)."""
        return self.extract(completion) if chat else completion

    def is_correct(self, prompt: str, reference: str, completion: str, chat: bool = False) -> bool:
        given = self.answer(completion, chat)
        return given is not None and self.correct(prompt, reference, given)

    def reward(self, prompt: str, reference: str, completion: str, format_reward: float = 0.0,
               chat: bool = False) -> float:
        """1 for a correct answer; `format_reward` for a wrong but well-formed one; else 0. `prompt` is the compact
        prompt (the checkers read the problem from it) in either form."""
        given = self.answer(completion, chat)
        if given is not None and self.correct(prompt, reference, given):
            return 1.0
        well_formed = given is not None and 0 < len(given) <= self.max_answer_len and all(
            c in self.answer_chars for c in given)
        return format_reward if well_formed else 0.0

    def batch(self, seed: int, n: int) -> list[tuple[str, str]]:
        """n training problems drawn from `seed`: never one of the held-out set (`held_out`), which is redrawn."""
        rng, held_out = random.Random(seed), held_out_prompts(self.name)
        problems = []
        while len(problems) < n:
            problem = self.make(rng)
            if problem[0] not in held_out:
                problems.append(problem)
        return problems

    def held_out(self) -> list[tuple[str, str]]:
        """The task's fixed held-out set: `HELD_OUT` distinct problems that training never draws (`batch`), the same
        for every run, evaluated during training (`engine/evaluate.py`)."""
        return _held_out(self.name)


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 19), rng.randint(0, 19)
    return f"{a}+{b}=", str(a + b)


def _sort(rng: random.Random) -> tuple[str, str]:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 6)))
    return f"sort:{digits}=", "".join(sorted(digits))


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
    return f"rev:{word}=", word[::-1]


def _countdown(rng: random.Random) -> tuple[str, str]:
    numbers = [rng.randint(1, 9) for _ in range(3)]
    a, b, c = numbers
    op1, op2 = rng.choice("+*"), rng.choice("+-*")
    expression = f"{a}{op1}{b}{op2}{c}"
    target = countdown_value(expression, numbers)
    if target is None or target <= 0:
        return _countdown(rng)
    return f"cd:{a},{b},{c}>{target}=", expression


def countdown_value(expression: str, allowed: list[int]) -> int | None:
    """Value of an expression of single-digit numbers with + − * and parentheses, each allowed number used at
    most once; None if it is malformed or uses other numbers. A small recursive-descent parser: no eval."""
    pos = 0
    pool = list(allowed)

    def peek():
        return expression[pos] if pos < len(expression) else ""

    def atom():
        nonlocal pos
        ch = peek()
        if ch == "(":
            pos += 1
            value = expr()
            if peek() != ")":
                raise ValueError
            pos += 1
            return value
        if ch.isdigit():
            pos += 1
            if int(ch) not in pool:
                raise ValueError
            pool.remove(int(ch))
            return int(ch)
        raise ValueError

    def term():
        nonlocal pos
        value = atom()
        while peek() == "*":
            pos += 1
            value *= atom()
        return value

    def expr():
        nonlocal pos
        value = term()
        while peek() in ("+", "-"):
            op = peek()
            pos += 1
            value = value + term() if op == "+" else value - term()
        return value

    try:
        value = expr()
    except ValueError:
        return None
    return value if pos == len(expression) else None


def _countdown_correct(prompt: str, reference: str, completion: str) -> bool:
    numbers, target = prompt[3:-1].split(">")
    return countdown_value(completion, [int(n) for n in numbers.split(",")]) == int(target)


def first_paragraph(reply: str) -> str:
    return re.split(r"\n\s*\n", reply.strip(), maxsplit=1)[0]


def _last(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text)
    return found[-1] if found else None


def _extract_number(reply: str) -> str | None:
    number = _last(r"(?<![\d.])-?\d+(?![\d.]*\d)", first_paragraph(reply).replace(",", ""))
    return None if number is None else str(int(number))


def _extract_digits(reply: str) -> str | None:
    run = _last(r"\d(?:[ ,]*\d)*", first_paragraph(reply))
    return None if run is None else re.sub(r"\D", "", run)


def _extract_word(reply: str) -> str | None:
    text = first_paragraph(reply)
    marked = _last(r"""(?:\*\*|__|[`'"“‘])([A-Za-z]+)(?:\*\*|__|[`'"”’])""", text)
    word = marked or _last(r"[A-Za-z]+", text)
    return None if word is None else word.lower()


def _extract_expression(reply: str) -> str | None:
    text = first_paragraph(reply).replace("×", "*").replace("·", "*")
    text = re.sub(r"(?<=[\d)])\s*[xX]\s*(?=[\d(])", "*", text)  # 3 x 5 → 3*5
    candidates = [c for c in re.findall(r"[\d(][\d\s+\-*()]*[\d)]", text) if re.search(r"[+\-*]", c)]
    return None if not candidates else re.sub(r"\s+", "", candidates[-1])


def _ask_add(prompt: str) -> str:
    a, b = prompt[:-1].split("+")
    return f"What is {a} + {b}? Reply with only the number."


def _ask_sort(prompt: str) -> str:
    return f"Sort the digits {prompt[5:-1]} in ascending order. Reply with only the sorted digits."


def _ask_reverse(prompt: str) -> str:
    return f"Reverse the letters of the word '{prompt[4:-1]}'. Reply with only the reversed word."


def _ask_countdown(prompt: str) -> str:
    numbers, target = prompt[3:-1].split(">")
    return (f"Using the numbers {numbers.replace(',', ', ')}, each at most once, with +, - and * (and parentheses), "
            f"make {target}. Reply with only the expression.")


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("add", "add two numbers below 20", _add, lambda p, r, c: c == r, "0123456789", 3, _ask_add,
             _extract_number),
        Task("sort", "sort 3–6 digits", _sort, lambda p, r, c: c == r, "0123456789", 6, _ask_sort, _extract_digits),
        Task("reverse", "reverse a 3–6 letter word", _reverse, lambda p, r, c: c == r,
             "abcdefghijklmnopqrstuvwxyz", 6, _ask_reverse, _extract_word),
        Task("countdown", "reach the target with the three numbers and + − * ( )", _countdown, _countdown_correct,
             "0123456789+-*()", 11, _ask_countdown, _extract_expression),
    )
}


HELD_OUT = 128  # problems in each task's held-out set: a Wilson 95% interval of about ±0.085 at accuracy 0.5


@functools.cache
def _held_out(name: str) -> list[tuple[str, str]]:
    rng, found = random.Random(f"held-out {name}"), {}
    while len(found) < HELD_OUT:
        prompt, answer = TASKS[name].make(rng)
        found.setdefault(prompt, answer)
    return list(found.items())


@functools.cache
def held_out_prompts(name: str) -> frozenset[str]:
    return frozenset(prompt for prompt, _ in _held_out(name))


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise DivvizInputError(unknown("task", name, TASKS))
    return TASKS[name]


def coin_rewards(seed: int, step: int, n: int) -> list[float]:
    """The random-reward control (Park et al. 2025, arXiv 2509.26114): a fair coin, 0 or 1, for each of a step's n
    completions, from the run's seed and the step alone: whatever the completions say, and the same for every
    measure run with that seed."""
    return [float(coin) for coin in random.Random(f"coin {seed} {step}").choices((0, 1), k=n)]
