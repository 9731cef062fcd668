"""The script language of Script, ScriptCondition and the pre/post conditions.

A small re-implementation of BehaviorTree.CPP v4's scripting language. Source
text goes through a hand-written tokenizer and a precedence-climbing parser
into a tiny AST, which is then compiled into nested Python closures: evaluating
a script is a handful of plain function calls, and nothing is ever handed to
``eval``/``exec``/``compile``.

    >>> env = DictEnv({"hp": 30})
    >>> compile_script("low := hp < 50; hp += 5; low ? 'flee' : 'fight'")(env)
    'flee'
    >>> env.data["hp"]
    35

Language summary (docs/behavior_tree.md has the full grammar):

* statements are separated by ``;``; a script returns the value of its last
  statement;
* ``key := v`` creates or overwrites a blackboard key; ``key = v`` and
  ``+= -= *= /=`` require the key to exist already;
* ``+ - * / %`` on numbers (``/`` is true division, ``%`` takes the sign of
  the divisor as in Python), ``+`` on two strings concatenates, ``..``
  concatenates strings and numbers (BT.CPP's concatenation operator);
* unary ``-`` and ``!``; ``== != < <= > >=`` (chainable, ``a < b < c`` means
  ``a < b && b < c``); ``&&`` and ``||`` short-circuit; ``c ? a : b``;
* literals: ints (``42``, ``0x2A``), floats (``3.5``, ``1e3``), strings in
  single or double quotes (``\\\\ \\' \\" \\n \\t`` escapes), ``true`` and ``false``;
* identifiers are blackboard keys; they may start with ``_`` or ``@`` (the
  ``@`` is kept in the key: the blackboard resolves ``@key`` to the root
  blackboard); names given in ``enums=`` are integer constants.

Types are strict: numbers never mix with strings or booleans, so ``'a' - 1``,
``true + 1`` or ``'3' == 3`` raise :class:`ScriptError`. Conditions (``!``,
``&&``, ``||``, ``?:``) accept booleans and numbers (non-zero is true).
"""

from __future__ import annotations

import numbers
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CompiledScript", "DictEnv", "ScriptEnv", "ScriptError", "compile_script"]


class ScriptEnv(Protocol):
    """What a script reads and writes: in a tree, the node's blackboard."""

    def get(self, key: str) -> Any:  # raises KeyError when the key does not exist
        ...

    def set(self, key: str, value: Any) -> None: ...


class CompiledScript(Protocol):
    """``compile_script``'s result: call it with an env to run the script.

    ``source`` is the script text, ``reads`` the keys whose values it reads,
    ``writes`` the keys it assigns (both frozensets of blackboard keys).
    """

    source: str
    reads: frozenset[str]
    writes: frozenset[str]

    def __call__(self, env: ScriptEnv) -> Any: ...


class DictEnv:
    """A minimal env over a plain dict, for tests, tools and the REPL."""

    __slots__ = ("data",)

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = {} if data is None else data

    def get(self, key: str) -> Any:
        return self.data[key]

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value


class ScriptError(ValueError):
    """A script that does not compile, or that failed while running.

    Attributes: ``problem`` (what went wrong), ``source`` (the whole script),
    ``line`` and ``column`` (1-based position of the offending token or
    sub-expression), ``expression`` (the failing sub-expression's text, for
    runtime errors). ``str()`` shows the source line with a caret under the
    position.
    """

    def __init__(
        self,
        problem: str,
        source: str,
        start: int | None = None,
        end: int | None = None,
        expression: str | None = None,
    ) -> None:
        self.problem = problem
        self.source = source
        self.expression = expression
        self.line: int | None = None
        self.column: int | None = None
        if start is not None:
            self.line = source.count("\n", 0, start) + 1
            self.column = start - (source.rfind("\n", 0, start) + 1) + 1
        super().__init__(self._format(start, end))

    def _format(self, start: int | None, end: int | None) -> str:
        where = f" in {self.expression!r}" if self.expression is not None else ""
        if start is None or self.line is None or self.column is None:
            return f"{self.problem}{where} in script {self.source!r}"
        multiline = "\n" in self.source
        at = f"line {self.line}, column {self.column}" if multiline else f"column {self.column}"
        text = self.source.split("\n")[self.line - 1].rstrip("\r")
        width = 1 if end is None else max(1, min(end, start + len(text) - self.column + 1) - start)
        caret = " " * (self.column - 1) + "^" * width
        return f"{self.problem}{where}, at {at} of script:\n    {text}\n    {caret}"


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "literal", "name", "op", "end"
    text: str
    value: Any
    start: int
    end: int


_ASSIGN_OPS = (":=", "=", "+=", "-=", "*=", "/=")
# longest first, so that "<=" wins over "<" and "+=" over "+"
_OPERATORS = sorted(
    [*_ASSIGN_OPS, "==", "!=", "<=", ">=", "&&", "||", "..",
     "+", "-", "*", "/", "%", "!", "<", ">", "?", ":", "(", ")", ";"],
    key=len, reverse=True,
)  # fmt: skip
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.\d+|\d+|\.\d+)(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"@?[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
_KEYWORDS = {"true": True, "false": False}


def _tokenize(source: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c.isspace():
            i += 1
            continue
        if c.isdigit() or (c == "." and i + 1 < n and source[i + 1].isdigit()):
            m = _NUMBER.match(source, i)
            assert m is not None  # a digit always starts a number
            text = m.group()
            if m.end() < n and (source[m.end()].isalnum() or source[m.end()] in "_@"):
                raise ScriptError(f"invalid number {source[i : m.end() + 1]!r}", source, i)
            if text[:2] in ("0x", "0X"):
                value: Any = int(text, 16)
            elif any(ch in text for ch in ".eE"):
                value = float(text)
            else:
                value = int(text)
            tokens.append(_Token("literal", text, value, i, m.end()))
            i = m.end()
            continue
        if c.isalpha() or c in "_@":
            m = _NAME.match(source, i)
            if m is None:
                raise ScriptError("'@' must be followed by a key name", source, i)
            text = m.group()
            if text in _KEYWORDS:
                tokens.append(_Token("literal", text, _KEYWORDS[text], i, m.end()))
            else:
                tokens.append(_Token("name", text, text, i, m.end()))
            i = m.end()
            continue
        if c in "'\"":
            i = _string(source, i, tokens)
            continue
        for op in _OPERATORS:
            if source.startswith(op, i):
                tokens.append(_Token("op", op, op, i, i + len(op)))
                i += len(op)
                break
        else:
            hint = " (BT.CPP's bitwise operators are not supported)" if c in "&|^~" else ""
            raise ScriptError(f"unexpected character {c!r}{hint}", source, i)
    tokens.append(_Token("end", "end of script", None, n, n))
    return tokens


def _string(source: str, start: int, tokens: list[_Token]) -> int:
    quote = source[start]
    chars: list[str] = []
    i = start + 1
    while i < len(source):
        c = source[i]
        if c == quote:
            tokens.append(_Token("literal", source[start : i + 1], "".join(chars), start, i + 1))
            return i + 1
        if c == "\\":
            nxt = source[i + 1 : i + 2]
            if nxt not in _ESCAPES:
                raise ScriptError(f"unknown escape '\\{nxt}' in string", source, i)
            chars.append(_ESCAPES[nxt])
            i += 2
            continue
        chars.append(c)
        i += 1
    raise ScriptError("unterminated string", source, start)


# --------------------------------------------------------------------------- AST


@dataclass(frozen=True, slots=True)
class _Literal:
    value: Any
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Name:
    key: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Unary:
    op: str
    operand: _Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Binary:  # arithmetic, concatenation, && and ||
    op: str
    left: _Node
    right: _Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Compare:  # a < b <= c: operands[i] ops[i] operands[i + 1], all must hold
    ops: tuple[str, ...]
    operands: tuple[_Node, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Ternary:
    condition: _Node
    then: _Node
    otherwise: _Node
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Assign:
    op: str
    key: str
    value: _Node
    start: int
    end: int


_Node = _Literal | _Name | _Unary | _Binary | _Compare | _Ternary | _Assign

# --------------------------------------------------------------------------- parser

# binary operator -> precedence (higher binds tighter); comparisons share one level
_PRECEDENCE = {
    "||": 1,
    "&&": 2,
    "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
    "+": 4, "-": 4, "..": 4,
    "*": 5, "/": 5, "%": 5,
}  # fmt: skip
_COMPARISON_LEVEL = 3
# Deeper scripts are certainly generated or hostile; the limit keeps parsing and
# evaluation far from Python's recursion limit, inside a tick that is already deep.
MAX_DEPTH = 100


class _Parser:
    """Recursive descent for statements and assignments, precedence climbing for operators."""

    def __init__(self, source: str, enums: Mapping[str, Any]) -> None:
        self.source = source
        self.enums = enums
        self.tokens = _tokenize(source)
        self.pos = 0
        self.depth = 0

    def error(self, problem: str, token: _Token) -> ScriptError:
        return ScriptError(problem, self.source, token.start)

    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def is_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.text in ops

    def expect(self, op: str) -> _Token:
        if not self.is_op(op):
            raise self.error(f"expected '{op}' but found {self._describe(self.tok)}", self.tok)
        self.pos += 1
        return self.tokens[self.pos - 1]

    @staticmethod
    def _describe(token: _Token) -> str:
        return token.text if token.kind == "end" else repr(token.text)

    def program(self) -> list[_Node]:
        statements: list[_Node] = []
        while self.tok.kind != "end":
            if self.is_op(";"):
                self.pos += 1
                continue
            statements.append(self.expression())
            if self.tok.kind != "end" and not self.is_op(";"):
                raise self.error(
                    f"expected ';' or an operator but found {self._describe(self.tok)}", self.tok
                )
        if not statements:
            raise ScriptError("empty script", self.source, 0)
        return statements

    def nest(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"script nests deeper than {MAX_DEPTH} levels", token)

    def expression(self) -> _Node:
        """assignment | ternary"""
        self.nest(self.tok)
        try:
            return self._expression()
        finally:
            self.depth -= 1

    def _expression(self) -> _Node:
        first = self.tok
        nxt = self.tokens[min(self.pos + 1, len(self.tokens) - 1)]  # "end" repeats at the end
        if first.kind == "name" and nxt.kind == "op" and nxt.text in _ASSIGN_OPS:
            if first.text in self.enums:
                raise self.error(f"cannot assign to enum constant {first.text!r}", first)
            self.pos += 2
            value = self.expression()
            return _Assign(nxt.text, first.text, value, first.start, value.end)
        node = self.ternary()
        if self.is_op(*_ASSIGN_OPS):
            raise self.error(
                f"'{self.tok.text}' needs a blackboard key on its left, not "
                f"{self.source[node.start : node.end]!r}",
                self.tok,
            )
        return node

    def ternary(self) -> _Node:
        condition = self.binary(1)
        if not self.is_op("?"):
            return condition
        self.pos += 1
        then = self.expression()
        self.expect(":")
        otherwise = self.ternary()
        return _Ternary(condition, then, otherwise, condition.start, otherwise.end)

    def binary(self, min_precedence: int) -> _Node:
        left = self.unary()
        while self.tok.kind == "op" and _PRECEDENCE.get(self.tok.text, 0) >= min_precedence:
            op = self.tok.text
            precedence = _PRECEDENCE[op]
            if precedence == _COMPARISON_LEVEL:
                ops: list[str] = []
                operands = [left]
                while self.tok.kind == "op" and _PRECEDENCE.get(self.tok.text) == _COMPARISON_LEVEL:
                    ops.append(self.tok.text)
                    self.pos += 1
                    operands.append(self.binary(_COMPARISON_LEVEL + 1))
                left = _Compare(tuple(ops), tuple(operands), left.start, operands[-1].end)
                continue
            self.pos += 1
            right = self.binary(precedence + 1)  # +1: every binary operator is left-associative
            left = _Binary(op, left, right, left.start, right.end)
        return left

    def unary(self) -> _Node:
        if self.is_op("-", "!"):
            token = self.tok
            self.pos += 1
            self.nest(token)
            try:
                operand = self.unary()
            finally:
                self.depth -= 1
            return _Unary(token.text, operand, token.start, operand.end)
        return self.primary()

    def primary(self) -> _Node:
        token = self.tok
        if token.kind == "literal":
            self.pos += 1
            return _Literal(token.value, token.start, token.end)
        if token.kind == "name":
            self.pos += 1
            if token.text in self.enums:
                return _Literal(self.enums[token.text], token.start, token.end)
            return _Name(token.text, token.start, token.end)
        if self.is_op("("):
            self.pos += 1
            inner = self.expression()
            self.expect(")")
            return inner
        raise self.error(f"expected a value but found {self._describe(token)}", token)


# --------------------------------------------------------------------------- compiler

_Fn = Callable[[Any], Any]
_NUMERIC = frozenset({int, float})
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": operator.mod,
}
_ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _is_number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float or (t is not bool and isinstance(v, numbers.Real))


_EPS = 1.1920928955078125e-07  # float epsilon: BT.CPP's tolerance for == between reals
_BOOL_TEXT = {"true": 1, "false": 0}


def _number_of(v: Any, enums: Mapping[str, Any]) -> Any:
    """A value as a number for mixed comparisons, as BT.CPP's StringToDouble:
    booleans are 1/0; a string is ``true``/``false``, an enum name or a number text.
    None when it is none of these."""
    t = type(v)
    if t is int or t is float:
        return v
    if t is bool:
        return int(v)
    if t is str:
        n = _BOOL_TEXT.get(v)
        if n is None:
            n = enums.get(v)
        if n is None:
            try:
                n = int(v)
            except ValueError:
                try:
                    n = float(v)
                except ValueError:
                    return None
        return n
    return v if _is_number(v) else None


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if _is_number(v):
        return "number"
    if isinstance(v, str):
        return "string"
    return type(v).__name__


def _show(v: Any) -> str:
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{_kind(v)} {text}"


def _concat_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if _is_number(v):
        return repr(v) if isinstance(v, float) else str(v)
    return None


class _Compiler:
    def __init__(self, source: str, enums: Mapping[str, Any]) -> None:
        self.source = source
        self.enums = enums
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.depth = 0

    def error(self, problem: str, node: _Node) -> ScriptError:
        return ScriptError(
            problem, self.source, node.start, node.end, self.source[node.start : node.end]
        )

    def compile(self, node: _Node) -> tuple[_Fn, bool]:
        """Return (closure, is_constant) for ``node``; constant sub-trees are folded."""
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:  # e.g. a chain of 500 '+': flat to parse, deep to run
                raise ScriptError(
                    f"expression nests deeper than {MAX_DEPTH} levels", self.source, node.start
                )
            return self._compile(node)
        finally:
            self.depth -= 1

    def _compile(self, node: _Node) -> tuple[_Fn, bool]:
        method = getattr(self, "_" + type(node).__name__.lstrip("_").lower())
        fn, children_constant = method(node)
        if children_constant and not isinstance(node, _Literal):
            try:
                value = fn(None)  # a constant expression never touches the env
            except ScriptError:
                return fn, False  # e.g. `false ? 1 / 0 : 2`: only fails if evaluated
            return (lambda env: value), True
        return fn, children_constant

    def _literal(self, node: _Literal) -> tuple[_Fn, bool]:
        value = node.value
        return (lambda env: value), True

    def _name(self, node: _Name) -> tuple[_Fn, bool]:
        key = node.key
        self.reads.add(key)

        def load(env: Any) -> Any:
            try:
                return env.get(key)
            except KeyError:
                raise self.error(
                    f"unknown blackboard key {key!r} (create it first with {key} := ...)", node
                ) from None

        return load, False

    def _unary(self, node: _Unary) -> tuple[_Fn, bool]:
        operand, constant = self.compile(node.operand)
        if node.op == "!":
            truth = self._truth(node.operand)

            def negate(env: Any) -> bool:
                v = operand(env)
                return v is False or (v is not True and not truth(v))

            return negate, constant

        def minus(env: Any) -> Any:
            v = operand(env)
            if type(v) in _NUMERIC or _is_number(v):
                return -v
            raise self.error(f"unary '-' needs a number, got {_show(v)}", node)

        return minus, constant

    def _truth(self, node: _Node) -> Callable[[Any], bool]:
        def truth(v: Any) -> bool:
            if v is True or v is False:
                return v
            if _is_number(v):
                return v != 0
            raise self.error(f"expected a boolean or a number, got {_show(v)}", node)

        return truth

    def _binary(self, node: _Binary) -> tuple[_Fn, bool]:
        left, left_constant = self.compile(node.left)
        right, right_constant = self.compile(node.right)
        constant = left_constant and right_constant
        op = node.op
        if op in ("&&", "||"):
            return self._logical(op, left, right, node), constant
        if op == "..":
            return self._concat(left, right, node), constant
        return self._arithmetic(op, left, right, node), constant

    def _logical(self, op: str, left: _Fn, right: _Fn, node: _Binary) -> _Fn:
        left_truth, right_truth = self._truth(node.left), self._truth(node.right)
        if op == "&&":

            def and_(env: Any) -> bool:
                a = left(env)
                if a is False or (a is not True and not left_truth(a)):
                    return False
                b = right(env)
                return b if b is True or b is False else right_truth(b)

            return and_

        def or_(env: Any) -> bool:
            a = left(env)
            if a is True or (a is not False and left_truth(a)):
                return True
            b = right(env)
            return b if b is True or b is False else right_truth(b)

        return or_

    def _concat(self, left: _Fn, right: _Fn, node: _Binary) -> _Fn:
        def concat(env: Any) -> str:
            a, b = left(env), right(env)
            ta, tb = _concat_text(a), _concat_text(b)
            if ta is None or tb is None:
                raise self.error(
                    f"'..' joins strings and numbers, got {_show(a)} and {_show(b)}", node
                )
            return ta + tb

        return concat

    def _arithmetic(self, op: str, left: _Fn, right: _Fn, node: _Node) -> _Fn:
        apply = self.arithmetic_op(op, node)

        def arithmetic(env: Any) -> Any:
            return apply(left(env), right(env))

        return arithmetic

    def arithmetic_op(self, op: str, node: _Node) -> Callable[[Any, Any], Any]:
        """The checked binary function for ``op`` (also used by ``+= -= *= /=``)."""
        pyop = _ARITHMETIC[op]

        def apply(a: Any, b: Any) -> Any:
            if type(a) is bool or type(b) is bool:  # BT.CPP: booleans are numbers (1/0)
                a, b = (int(a) if type(a) is bool else a), (int(b) if type(b) is bool else b)
            if (type(a) in _NUMERIC and type(b) in _NUMERIC) or (_is_number(a) and _is_number(b)):
                try:
                    return pyop(a, b)
                except ZeroDivisionError:
                    raise self.error("division by zero", node) from None
                except ArithmeticError as exc:
                    raise self.error(f"arithmetic error: {exc}", node) from None
            if op == "+" and type(a) is str and type(b) is str:
                return a + b
            needs = "two numbers or two strings" if op == "+" else "two numbers"
            raise self.error(f"'{op}' needs {needs}, got {_show(a)} and {_show(b)}", node)

        return apply

    def _compare(self, node: _Compare) -> tuple[_Fn, bool]:
        compiled = [self.compile(operand) for operand in node.operands]
        operands = [fn for fn, _ in compiled]
        constant = all(c for _, c in compiled)
        checks = [self._comparison(op, node) for op in node.ops]
        if len(checks) == 1:
            check, left, right = checks[0], operands[0], operands[1]

            pyop = _ORDERING[node.ops[0]]

            def compare(env: Any) -> bool:
                a, b = left(env), right(env)
                if type(a) is int and type(b) is int:  # fast path, checks inlined
                    return pyop(a, b)
                return check(a, b)

            return compare, constant

        pairs = tuple(zip(checks, operands[1:], strict=True))
        first = operands[0]

        def compare_chain(env: Any) -> bool:
            a = first(env)
            for check, operand in pairs:
                b = operand(env)
                if not check(a, b):
                    return False
                a = b
            return True

        return compare_chain, constant

    def _comparison(self, op: str, node: _Compare) -> Callable[[Any, Any], bool]:
        """BT.CPP's comparison rules: numbers (booleans count as 1/0) compare as numbers,
        equal when within float epsilon; two strings compare as strings; a string and a
        number compare after the string is converted (``true``/``false``, an enum name,
        a number text); anything else must be of one kind."""
        pyop = _ORDERING[op]
        equality = op in ("==", "!=")
        enums = self.enums

        def numbers(a: Any, b: Any) -> bool:
            if equality and (type(a) is float or type(b) is float):
                same = abs(a - b) <= _EPS
                return same if op == "==" else not same
            return bool(pyop(a, b))

        def check(a: Any, b: Any) -> bool:
            ta, tb = type(a), type(b)
            if ta is str and tb is str:
                return pyop(a, b)
            na, nb = _number_of(a, enums), _number_of(b, enums)
            if na is not None and nb is not None:
                return numbers(na, nb)
            ka, kb = _kind(a), _kind(b)
            if ka == kb and ka not in ("string", "number", "boolean") and equality:
                return bool(pyop(a, b))
            what = "compare" if equality else "order"
            raise self.error(f"cannot {what} {_show(a)} with {_show(b)} using '{op}'", node)

        return check

    def _ternary(self, node: _Ternary) -> tuple[_Fn, bool]:
        condition, c1 = self.compile(node.condition)
        then, c2 = self.compile(node.then)
        otherwise, c3 = self.compile(node.otherwise)
        truth = self._truth(node.condition)

        def choose(env: Any) -> Any:
            c = condition(env)
            return then(env) if c is True or (c is not False and truth(c)) else otherwise(env)

        return choose, c1 and c2 and c3

    def _assign(self, node: _Assign) -> tuple[_Fn, bool]:
        key, op = node.key, node.op
        value, _ = self.compile(node.value)
        self.writes.add(key)
        if op != ":=" and op != "=":
            self.reads.add(key)

        def store(env: Any, v: Any) -> Any:
            try:
                env.set(key, v)
            except (TypeError, ValueError) as exc:
                raise self.error(f"cannot assign {_show(v)} to {key!r}: {exc}", node) from exc
            return v

        def existing(env: Any) -> Any:
            try:
                return env.get(key)
            except KeyError:
                raise self.error(
                    f"'{op}' needs an existing key but {key!r} does not exist "
                    f"(create it with {key} := ...)",
                    node,
                ) from None

        if op == ":=":
            return (lambda env: store(env, value(env))), False
        if op == "=":

            def assign(env: Any) -> Any:
                # the entry must exist, with or without a value (a blackboard creates the
                # entry of every {key} port when the tree is built, as BT.CPP does)
                exists = getattr(env, "has_entry", None)
                if exists is None:
                    existing(env)
                elif not exists(key):
                    raise self.error(f"'=' needs an existing key but {key!r} does not exist "
                                     f"(create it with {key} := ...)", node)
                return store(env, value(env))

            return assign, False
        apply = self.arithmetic_op(op[0], node)

        def update(env: Any) -> Any:
            return store(env, apply(existing(env), value(env)))

        return update, False


def compile_script(source: str, enums: Mapping[str, Any] | None = None) -> CompiledScript:
    """Compile ``source`` into a callable ``script(env) -> value of the last statement``.

    ``env`` needs ``get(key)`` (raising KeyError for a missing key) and
    ``set(key, value)``; a blackboard qualifies. ``enums`` maps constant names
    (e.g. ``{"ALERT": 2}``) to values; they shadow blackboard keys of the same
    name and cannot be assigned. Raises :class:`ScriptError` for a syntax error;
    the compiled script raises :class:`ScriptError` for runtime errors (unknown
    key, type mismatch, division by zero, a value the env refuses to store).
    The result also carries ``source``, ``reads`` and ``writes``.
    """
    if not isinstance(source, str):
        raise TypeError(f"script source must be a str, got {type(source).__name__}")
    statements = _Parser(source, enums or {}).program()
    compiler = _Compiler(source, enums or {})
    fns = [compiler.compile(statement)[0] for statement in statements]
    if len(fns) == 1:
        run = fns[0]  # every closure is fresh per compile, so it can carry the attributes
    else:
        head, last = tuple(fns[:-1]), fns[-1]

        def run(env: Any) -> Any:
            for fn in head:
                fn(env)
            return last(env)

    run.source = source  # type: ignore[attr-defined]
    run.reads = frozenset(compiler.reads)  # type: ignore[attr-defined]
    run.writes = frozenset(compiler.writes)  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]
