"""The calculator task: multi-digit arithmetic a small model cannot do in its head, with a
calculator tool it can call, and the problem's answer column as the check.

A prompt asks for a product of a 3-digit and a 2-digit number ("What is 347 times 58? ...")
and for the final answer on the last line after "Answer:", as the math task's prompts do;
``answer_reward`` (the task's gold, "calculator") checks that the number there is the
``answer`` column's. The policy may call ``calculator`` (``tools.py``'s format); the
SFT demonstrations (``scripts/make_tool_data.py``) show it calling the tool once and then
answering with the result, which is the behaviour GRPO then has to make reliable.

``calculator`` evaluates an arithmetic expression by walking its Python syntax tree: numbers,
+ - * / // % and unary minus, parentheses; powers up to ``MAX_EXPONENT``; nothing else (no
names, calls or attributes), so a policy's text cannot run code through it.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Iterator

from rlhfkit.tasks.completions import completion_text

MAX_EXPONENT = 100
"""The largest exponent ``calculator`` raises to: a policy's "9 ** 9 ** 9" is refused."""
PROMPT = (
    "What is {a} times {b}? Give the final answer as a number on the last line, after 'Answer:'."
)
ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+")
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, with numbers, + - * / and parentheses, such as "347 * 58"
    """
    try:
        tree = ast.parse(expression.replace("x", "*").replace("×", "*"), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from error
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is over {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / ** ( ) are allowed, not {ast.unparse(node)!r}")


def answer_reward(completions, answer, **kwargs) -> list[float]:
    """1 where the final answer is the number in the ``answer`` column, else 0, written as for
    TRL. The final answer is the last number after the response's last "Answer:", or, without
    one, the last number of the response; commas between digit groups are read away. A
    product restated ("347 * 58") is no answer: only the number counts, where the math task's
    reward would read the expression's value."""
    return [
        float(final_number(completion_text(completion)) == int(gold))
        for completion, gold in zip(completions, answer, strict=True)
    ]


def final_number(text: str) -> int | None:
    """The last number of ``text`` after its last "Answer:" (of all of it without one)."""
    found = ANSWER.split(text)[-1]
    numbers = NUMBER.findall(found)
    return int(numbers[-1].replace(",", "")) if numbers else None


def problems(count: int, seed: int) -> Iterator[dict]:
    """``count`` multiplication problems of a 3-digit and a 2-digit number, as prompt records
    with their ``answer`` column."""
    rng = random.Random(seed)
    for _ in range(count):
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        yield {"prompt": PROMPT.format(a=a, b=b), "answer": str(a * b), "a": a, "b": b}
