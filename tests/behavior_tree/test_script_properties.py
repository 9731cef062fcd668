"""Property tests: random expressions, printed with the fewest parentheses their
precedence allows, evaluate to what a reference evaluator computes on the same
expression tree. The printer leans on precedence and associativity, so a parser
that gets either wrong produces a different value."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from behavior_tree.script import DictEnv, ScriptError, compile_script

VARIABLES = {"a": 3, "b": -4, "c": 2.5, "d": 0}
ARITHMETIC = ("+", "-", "*", "/", "%")
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")

# printing precedence: higher binds tighter
PRECEDENCE = {"?": 0, "||": 1, "&&": 2, "cmp": 3, "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}
UNARY, ATOM = 6, 7

Expr = tuple  # ("num", v) | ("var", name) | ("neg", e) | ("not", e) | (op, l, r) | ("?", c, t, f)


LEAVES: list[Any] = [2, 3, 5, 7, 11, 13, 0.5, 1.25]  # distinct and non-zero: a wrong grouping shows


def numeric(rng: random.Random, depth: int) -> Expr:
    """A random numeric expression; mostly binary operators, so precedence levels mix."""
    roll = rng.random()
    if depth == 0 or roll < 0.15:
        if rng.random() < 0.3:
            return ("var", rng.choice(sorted(VARIABLES)))
        return ("num", rng.choice(LEAVES))
    if roll < 0.85:
        return (rng.choice(ARITHMETIC), numeric(rng, depth - 1), numeric(rng, depth - 1))
    if roll < 0.93:
        return ("neg", numeric(rng, depth - 1))
    return ("?", boolean(rng, depth - 1), numeric(rng, depth - 1), numeric(rng, depth - 1))


def boolean(rng: random.Random, depth: int) -> Expr:
    """A random condition: comparisons of numeric expressions joined by && || !."""
    roll = rng.random()
    if depth == 0 or roll < 0.1:
        return ("num", rng.random() < 0.5)
    if roll < 0.35:
        return (rng.choice(COMPARISONS), numeric(rng, depth - 1), numeric(rng, depth - 1))
    if roll < 0.9:
        return (rng.choice(["&&", "||"]), boolean(rng, depth - 1), boolean(rng, depth - 1))
    return ("not", boolean(rng, depth - 1))


def precedence(e: Expr) -> int:
    kind = e[0]
    if kind in ("num", "var"):
        return ATOM
    if kind in ("neg", "not"):
        return UNARY
    return PRECEDENCE["cmp" if kind in COMPARISONS else kind]


def render(e: Expr, spaced: bool) -> str:
    def wrap(child: Expr, needs: bool) -> str:
        text = render(child, spaced)
        return f"({text})" if needs else text

    sp = " " if spaced else ""
    kind = e[0]
    if kind == "num":
        return (
            {True: "true", False: "false"}.get(e[1], repr(e[1]))
            if isinstance(e[1], bool)
            else repr(e[1])
        )
    if kind == "var":
        return e[1]
    if kind in ("neg", "not"):
        sign = "-" if kind == "neg" else "!"
        return sign + sp + wrap(e[1], precedence(e[1]) < UNARY)
    if kind == "?":
        cond = wrap(e[1], precedence(e[1]) <= PRECEDENCE["?"])
        return f"{cond}{sp}?{sp}{render(e[2], spaced)}{sp}:{sp}{render(e[3], spaced)}"
    p = precedence(e)
    # left-associative: the right operand needs parentheses at equal precedence too;
    # comparisons chain, so a comparison never appears unparenthesised under another
    left = wrap(e[1], precedence(e[1]) < p or (p == PRECEDENCE["cmp"] and precedence(e[1]) == p))
    right = wrap(e[2], precedence(e[2]) <= p)
    return f"{left}{sp}{kind}{sp}{right}"


def reference(e: Expr) -> Any:
    """Evaluate the tree directly with Python semantics (short-circuiting like the script)."""
    kind = e[0]
    if kind == "num":
        return e[1]
    if kind == "var":
        return VARIABLES[e[1]]
    if kind == "neg":
        return -reference(e[1])
    if kind == "not":
        return not reference(e[1])
    if kind == "?":
        return reference(e[2]) if reference(e[1]) else reference(e[3])
    if kind == "&&":
        return reference(e[1]) and reference(e[2])
    if kind == "||":
        return reference(e[1]) or reference(e[2])
    a, b = reference(e[1]), reference(e[2])
    return {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b,
        "%": lambda: a % b,
        "==": lambda: a == b,
        "!=": lambda: a != b,
        "<": lambda: a < b,
        "<=": lambda: a <= b,
        ">": lambda: a > b,
        ">=": lambda: a >= b,
    }[kind]()


def check(e: Expr, spaced: bool) -> None:
    source = render(e, spaced)
    script = compile_script(source)
    try:
        expected = reference(e)
    except ZeroDivisionError:
        try:
            script(DictEnv(dict(VARIABLES)))
        except ScriptError as error:
            assert error.problem == "division by zero", source
            return
        raise AssertionError(f"{source!r} should fail with division by zero") from None
    got = script(DictEnv(dict(VARIABLES)))
    assert got == expected and type(got) is type(expected), (source, got, expected)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.randoms(use_true_random=False), st.booleans())
def test_random_arithmetic_matches_reference_evaluation(rng: random.Random, spaced: bool) -> None:
    check(numeric(rng, 4), spaced)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.randoms(use_true_random=False), st.booleans())
def test_random_conditions_match_reference_evaluation(rng: random.Random, spaced: bool) -> None:
    check(boolean(rng, 5), spaced)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["+=", "-=", "*="]),
            st.integers(-5, 5),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_statement_sequences_update_keys_like_python(steps: list[tuple[str, str, int]]) -> None:
    expected = dict(VARIABLES)
    for key, op, value in steps:
        expected[key] = {
            "+=": expected[key] + value,
            "-=": expected[key] - value,
            "*=": expected[key] * value,
        }[op]
    env = DictEnv(dict(VARIABLES))
    last = compile_script("; ".join(f"{k} {op} {v}" for k, op, v in steps))(env)
    assert env.data == expected
    assert last == expected[steps[-1][0]]


FRAGMENTS = [
    "a", "b", "@c", "_d", "1", "2.5", "0x1F", "'s'", '"t"', "true", "false",
    ":=", "=", "+=", "-=", "*=", "/=", "+", "-", "*", "/", "%", "..", "!",
    "==", "!=", "<", "<=", ">", ">=", "&&", "||", "?", ":", "(", ")", ";", " ",
    "'", "\\", "#", "&", ".", "1e", "@", "\n", "\r\n", "\t",
]  # fmt: skip


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=14))
def test_any_token_soup_either_runs_or_raises_script_error(parts: list[str]) -> None:
    """Bad input never escapes as anything but ScriptError, at compile or run time."""
    source = "".join(parts)
    try:
        script = compile_script(source)
    except ScriptError as error:
        assert error.column is not None and 1 <= error.column <= len(source) + 1
        return
    env = DictEnv({"a": 3, "b": "x", "@c": True, "_d": 0.5})
    try:
        script(env)
    except ScriptError as error:
        assert error.expression is not None and error.expression in source
