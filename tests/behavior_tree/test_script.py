"""The script language: every operator, precedence, short-circuit, errors with positions."""

from __future__ import annotations

from typing import Any

import pytest

from behavior_tree.script import DictEnv, ScriptError, compile_script


def run(source: str, **data: Any) -> Any:
    return compile_script(source)(DictEnv(data))


class RefusingEnv(DictEnv):
    """An env that refuses to change a key's type, like a typed blackboard entry."""

    def set(self, key: str, value: Any) -> None:
        if key in self.data and type(self.data[key]) is not type(value):
            raise TypeError(f"{key} holds {type(self.data[key]).__name__}")
        super().set(key, value)


# --------------------------------------------------------------------------- literals


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("42", 42),
        ("0x2A", 42),
        ("3.5", 3.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("'single'", "single"),
        ('"double"', "double"),
        ("'it\\'s'", "it's"),
        ('"tab\\tnew\\nline\\\\"', "tab\tnew\nline\\"),
        ("''", ""),
        ("true", True),
        ("false", False),
    ],
)
def test_literals_evaluate_to_python_values(source: str, expected: Any) -> None:
    value = run(source)
    assert value == expected and type(value) is type(expected)


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("7 + 2", 9),
        ("7 - 2", 5),
        ("7 * 2", 14),
        ("7 / 2", 3.5),
        ("6 / 2", 3.0),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("7.5 % 2", 1.5),
        ("1 + 0.5", 1.5),
        ("-3", -3),
        ("- -3", 3),
        ("'ab' + 'cd'", "abcd"),
        ("'hp: ' .. 30", "hp: 30"),
        ("1.5 .. 'x' .. 2", "1.5x2"),
    ],
)
def test_arithmetic_and_concatenation(source: str, expected: Any) -> None:
    value = run(source)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),  # left-associative
        ("100 / 10 / 5", 2.0),
        ("2 * 3 % 4", 2),  # same level, left to right
        ("-2 * 3", -6),
        ("-(2 + 3)", -5),
        ("1 + 2 < 4", True),  # arithmetic binds tighter than comparison
        ("2 * 3 == 6", True),
    ],
)
def test_precedence_and_associativity(source: str, expected: Any) -> None:
    assert run(source) == expected


def test_logical_operators_bind_looser_than_comparisons_and_and_tighter_than_or() -> None:
    assert run("1 < 2 && 3 < 4") is True
    assert run("true || false && false") is True  # && before ||
    assert run("(true || false) && false") is False
    assert run("!true || true") is True  # ! binds tightest
    assert run("!(true || true)") is False


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("1 == 1", True),
        ("1 == 1.0", True),
        ("1 != 2", True),
        ("'a' == 'a'", True),
        ("'a' != 'a'", False),
        ("true == false", False),
        ("2 < 3", True),
        ("3 <= 3", True),
        ("4 > 3", True),
        ("2 >= 3", False),
        ("'abc' < 'abd'", True),
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("3 > 2 >= 2 == 2", True),
    ],
)
def test_comparisons(source: str, expected: bool) -> None:
    assert run(source) is expected


def test_chained_comparison_compares_neighbours_not_a_boolean_result() -> None:
    # `1 < 2 == true` is `1 < 2 && 2 == true`; true counts as 1 (BT.CPP), so it is false
    assert run("1 < 2 == true") is False
    assert run("0 < 1 == true") is True


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("flag == true", True),  # a string "true" compared with a boolean: converted
        ("flag == 1", True),
        ("count + 1 == 43", False),  # "42" + 1 is an error, not a conversion (see below)
        ("count == 42", True),  # a number text compared with a number: converted
        ("count > 41.5", True),
        ("mode == 'ALERT'", True),  # two strings: compared as strings
        ("true + 1", 2),  # booleans are numbers in arithmetic too
        ("true < false", False),
        ("0.1 + 0.2 == 0.3", True),  # reals are equal within float epsilon, as BT.CPP
    ],
)
def test_strings_numbers_and_booleans_convert_as_in_bt_cpp(source: str, expected: Any) -> None:
    env = {"flag": "true", "count": "42", "mode": "ALERT", "name": "guard"}
    if source.startswith("count + 1"):
        with pytest.raises(ScriptError, match="'\\+' needs two numbers or two strings"):
            run(source, **env)
        return
    assert run(source, **env) == expected


def test_enum_names_convert_in_comparisons_with_numbers() -> None:
    script = compile_script("color == RED && state == 2", enums={"RED": 1, "ALERT": 2})
    assert script(DictEnv({"color": 1, "state": "ALERT"})) is True  # 'ALERT' -> 2


def test_ternary_picks_a_branch_and_nests_to_the_right() -> None:
    assert run("true ? 1 : 2") == 1
    assert run("false ? 1 : 2") == 2
    assert run("false ? 1 : true ? 2 : 3") == 2
    assert run("x > 5 ? 'big' : 'small'", x=9) == "big"
    assert run("0 ? 'a' : 'b'") == "b"  # numbers are conditions: zero is false


def test_conditions_accept_numbers_as_truth_values() -> None:
    assert run("!0") is True
    assert run("2 && 0.5") is True
    assert run("0 || 0") is False


# --------------------------------------------------------------------------- short-circuit


def test_and_does_not_evaluate_its_right_side_when_the_left_is_false() -> None:
    env = DictEnv({"n": 0})
    assert compile_script("false && (n += 1) > 0")(env) is False
    assert env.data["n"] == 0
    assert compile_script("true && (n += 1) > 0")(env) is True
    assert env.data["n"] == 1


def test_or_does_not_evaluate_its_right_side_when_the_left_is_true() -> None:
    assert run("true || missing_key") is True
    with pytest.raises(ScriptError, match="unknown blackboard key 'missing_key'"):
        run("false || missing_key")


def test_ternary_evaluates_only_the_chosen_branch() -> None:
    env = DictEnv({"a": 0, "b": 0})
    compile_script("true ? (a := 1) : (b := 1)")(env)
    assert env.data == {"a": 1, "b": 0}
    assert run("false ? 1 / 0 : 2") == 2


# --------------------------------------------------------------------------- assignment


def test_create_assign_returns_the_value_and_stores_it() -> None:
    env = DictEnv()
    assert compile_script("x := 4")(env) == 4
    assert env.data == {"x": 4}


def test_plain_assign_needs_an_existing_key() -> None:
    env = DictEnv({"x": 1})
    compile_script("x = 5")(env)
    assert env.data["x"] == 5
    with pytest.raises(ScriptError, match="'y' does not exist") as info:
        compile_script("x = 1; y = 2")(env)
    assert info.value.column == 8 and info.value.expression == "y = 2"


@pytest.mark.parametrize(
    ("source", "expected"),
    [("n += 3", 13), ("n -= 3", 7), ("n *= 3", 30), ("n /= 4", 2.5)],
)
def test_compound_assignment_updates_the_key(source: str, expected: Any) -> None:
    env = DictEnv({"n": 10})
    assert compile_script(source)(env) == expected
    assert env.data["n"] == expected


def test_compound_assignment_on_strings_concatenates() -> None:
    env = DictEnv({"log": "a"})
    compile_script("log += 'b'; log += 'c'")(env)
    assert env.data["log"] == "abc"


def test_compound_assignment_needs_an_existing_key() -> None:
    with pytest.raises(ScriptError, match="'counter' does not exist"):
        run("counter += 1")


def test_assignment_is_right_associative() -> None:
    env = DictEnv()
    compile_script("a := b := 3")(env)
    assert env.data == {"a": 3, "b": 3}


def test_statements_run_in_order_and_the_last_value_is_returned() -> None:
    env = DictEnv()
    assert compile_script("a := 1; b := a + 1; ; a + b;")(env) == 3
    assert env.data == {"a": 1, "b": 2}


def test_keys_may_start_with_underscore_or_at_and_keep_the_at() -> None:
    env = DictEnv({"@alarm": True, "_private": 2})
    assert compile_script("@alarm && _private == 2")(env) is True
    compile_script("@level := _private * 10")(env)
    assert env.data["@level"] == 20


def test_compiled_script_reports_what_it_reads_and_writes() -> None:
    script = compile_script("a := b + 1; c += d; e = 3; f ? g : 1")
    assert script.reads == {"b", "c", "d", "f", "g"}
    assert script.writes == {"a", "c", "e"}
    assert script.source == "a := b + 1; c += d; e = 3; f ? g : 1"


def test_a_value_the_env_refuses_becomes_a_script_error_naming_the_assignment() -> None:
    env = RefusingEnv({"hp": 10})
    with pytest.raises(ScriptError, match="cannot assign string 'full' to 'hp'") as info:
        compile_script("hp := 'full'")(env)
    assert isinstance(info.value.__cause__, TypeError)


# --------------------------------------------------------------------------- enums


def test_enums_are_constants_that_shadow_keys() -> None:
    env = DictEnv({"state": 2, "ALERT": 99})
    script = compile_script("state == ALERT ? 'alert' : 'calm'", enums={"ALERT": 2, "CALM": 0})
    assert script(env) == "alert"
    assert "ALERT" not in script.reads


def test_assigning_an_enum_is_a_compile_error() -> None:
    with pytest.raises(ScriptError, match="cannot assign to enum constant 'ALERT'"):
        compile_script("ALERT := 3", enums={"ALERT": 2})


# --------------------------------------------------------------------------- compile errors


@pytest.mark.parametrize(
    ("source", "problem", "column"),
    [
        ("1 +", "expected a value but found end of script", 4),
        ("(", "expected a value but found end of script", 2),
        ("(1 + 2", "expected ')' but found end of script", 7),
        ("x := (3 + ) * 2", "expected a value but found ')'", 11),
        ("1 2", "expected ';' or an operator but found '2'", 3),
        ("a + b := 3", "':=' needs a blackboard key on its left, not 'a + b'", 7),
        ("3 = 4", "'=' needs a blackboard key on its left", 3),
        ("'open", "unterminated string", 1),
        ("x := 'a\\q'", "unknown escape", 8),
        ("3abc", "invalid number", 1),
        ("a & b", "bitwise operators are not supported", 3),
        ("a # b", "unexpected character '#'", 3),
        ("@ + 1", "'@' must be followed by a key name", 1),
        ("true ? 1", "expected ':' but found end of script", 9),
        ("", "empty script", 1),
        (" ; ;", "empty script", 1),
    ],
)
def test_syntax_errors_name_the_problem_and_column(source: str, problem: str, column: int) -> None:
    with pytest.raises(ScriptError) as info:
        compile_script(source)
    error = info.value
    assert problem in error.problem
    assert error.column == column
    assert error.source == source
    assert isinstance(error, ValueError)


def test_error_message_shows_the_source_with_a_caret_under_the_column() -> None:
    with pytest.raises(ScriptError) as info:
        compile_script("hp := (3 + ) * 2")
    lines = str(info.value).splitlines()
    assert "column 12" in lines[0]
    assert lines[1].strip() == "hp := (3 + ) * 2"
    assert lines[2].index("^") == lines[1].index(")")


def test_errors_in_multiline_scripts_give_line_and_column() -> None:
    with pytest.raises(ScriptError) as info:
        compile_script("a := 1;\nb := a +\n;")
    assert (info.value.line, info.value.column) == (3, 1)
    assert "line 3, column 1" in str(info.value)


@pytest.mark.parametrize(
    "source",
    [
        "(" * 150 + "1" + ")" * 150,  # deep parentheses
        "!" * 150 + "true",  # deep unary chain
        " + ".join(["1"] * 150),  # long flat chain: deep once compiled
        "a := " * 150 + "1",  # assignment chain
    ],
)
def test_absurdly_deep_scripts_are_rejected_cleanly(source: str) -> None:
    with pytest.raises(ScriptError, match="nests deeper than 100 levels"):
        compile_script(source)


def test_moderately_deep_scripts_compile_and_run() -> None:
    assert run("(" * 40 + "1" + ")" * 40) == 1
    assert run(" + ".join(["x"] * 90), x=1) == 90  # not folded: runs 90 closures deep
    assert run("!" * 60 + "true") is True


def test_an_error_at_the_end_of_a_trailing_newline_still_formats() -> None:
    with pytest.raises(ScriptError) as info:
        compile_script("a := 1 +\r\n")
    assert (info.value.line, info.value.column) == (2, 1)
    assert "line 2, column 1" in str(info.value)


def test_non_string_source_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        compile_script(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- runtime errors


@pytest.mark.parametrize(
    ("source", "problem", "expression"),
    [
        ("name - 1", "'-' needs two numbers, got string 'guard' and number 1", "name - 1"),
        ("hp + name", "'+' needs two numbers or two strings", "hp + name"),
        ("hp / zero", "division by zero", "hp / zero"),
        ("hp % zero", "division by zero", "hp % zero"),
        ("2 * (missing + 1)", "unknown blackboard key 'missing'", "missing"),
        ("-name", "unary '-' needs a number", "-name"),
        ("!name", "expected a boolean or a number, got string 'guard'", "name"),
        ("name ? 1 : 2", "expected a boolean or a number", "name"),
        ("name && true", "expected a boolean or a number", "name"),
        ("name == 3", "cannot compare string 'guard' with number 3", "name == 3"),
        ("name < 3", "cannot order", "name < 3"),
        ("items .. 'x'", "'..' joins strings and numbers", "items .. 'x'"),
        ("hp /= zero", "division by zero", "hp /= zero"),
    ],
)
def test_runtime_errors_name_the_failing_sub_expression(
    source: str, problem: str, expression: str
) -> None:
    script = compile_script(source)
    env = DictEnv({"name": "guard", "hp": 10, "zero": 0, "items": [1, 2]})
    with pytest.raises(ScriptError) as info:
        script(env)
    error = info.value
    assert problem in error.problem
    assert error.expression == expression
    assert error.column == source.index(expression) + 1
    assert expression in str(error)


def test_unknown_key_error_is_raised_at_run_time_not_compile_time() -> None:
    script = compile_script("ghost + 1")
    assert run("ghost + 1", ghost=1) == 2
    with pytest.raises(ScriptError, match="unknown blackboard key 'ghost'"):
        script(DictEnv())


def test_constant_sub_expressions_are_folded_but_errors_stay_at_run_time() -> None:
    script = compile_script("flag ? 1 / 0 : 2 * 3 + 1")
    assert script(DictEnv({"flag": False})) == 7
    with pytest.raises(ScriptError, match="division by zero"):
        script(DictEnv({"flag": True}))


def test_scripts_never_reach_python_eval() -> None:
    # Python syntax is not script syntax: attribute access and calls do not parse.
    for source in ("__import__('os')", "x.__class__", "[1, 2]", "lambda: 1"):
        with pytest.raises(ScriptError):
            compile_script(source)(DictEnv({"x": 1, "__import__": 1, "lambda": 1}))
