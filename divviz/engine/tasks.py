"""Synthetic tasks with verifiable rewards, generated from a seed, checked exactly.

Each task makes (prompt, answer) pairs and scores a completion: reward 1 if the completion (up to the
end-of-sequence token) is a correct answer, else 0; with `format_reward` > 0, a wrong but well-formed
answer (only the characters the answer may contain) earns that much.

    add        "17+8="         → "25"
    sort       "sort:3142="    → "1234"
    reverse    "rev:abcd="     → "dcba"
    countdown  "cd:3,5,7>22="  → any expression over the given numbers (each at most once) with + − * and
                                 parentheses that evaluates to the target, e.g. "3*5+7" (parsed, never eval'd)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from divviz.catalogue.params import DivvizInputError

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz+-*=:,>() "


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    make: Callable[[random.Random], tuple[str, str]]  # rng -> (prompt, reference answer)
    correct: Callable[[str, str, str], bool]  # (prompt, reference, completion) -> bool
    answer_chars: str  # characters a well-formed answer may use
    max_answer_len: int

    def reward(self, prompt: str, reference: str, completion: str, format_reward: float = 0.0) -> float:
        if self.correct(prompt, reference, completion):
            return 1.0
        well_formed = 0 < len(completion) <= self.max_answer_len and all(c in self.answer_chars for c in completion)
        return format_reward if well_formed else 0.0

    def batch(self, seed: int, n: int) -> list[tuple[str, str]]:
        rng = random.Random(seed)
        return [self.make(rng) for _ in range(n)]


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
    target = evaluate(expression, numbers)
    if target is None or target <= 0:
        return _countdown(rng)
    return f"cd:{a},{b},{c}>{target}=", expression


def evaluate(expression: str, allowed: list[int]) -> int | None:
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
    return evaluate(completion, [int(n) for n in numbers.split(",")]) == int(target)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("add", "add two numbers below 20", _add, lambda p, r, c: c == r, "0123456789", 3),
        Task("sort", "sort 3–6 digits", _sort, lambda p, r, c: c == r, "0123456789", 6),
        Task("reverse", "reverse a 3–6 letter word", _reverse, lambda p, r, c: c == r,
             "abcdefghijklmnopqrstuvwxyz", 6),
        Task("countdown", "reach the target with the three numbers and + − * ( )", _countdown, _countdown_correct,
             "0123456789+-*()", 11),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise DivvizInputError(f"unknown task '{name}'; known: {', '.join(TASKS)}")
    return TASKS[name]
