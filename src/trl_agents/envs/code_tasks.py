"""The code task family: a tiny Python project with a failing unittest, and a bug to fix or a function to write.

Every task is a small project of one module (`stats.py`, or `shop/stats.py` inside a package) and a visible
unittest file (`test_stats.py`) that fails at the start. The instruction reads like an issue ("The test in
test_stats.py fails: `total` skips the last element. Fix the bug in stats.py so that `python3 -m unittest`
passes."). Only the standard library is used, so the project runs in a bare sandbox. The hidden `check` imports the
module afresh from the working directory and asserts the function's results on the visible cases plus at least three
cases the visible test does not have (edge cases among them), so a function special-cased to the visible test's
values fails it: the starting code fails one of those extra cases too (except for `fix-empty-case`, whose bug shows
only on the empty list). The check looks at behaviour only, never at the test file.

Kinds (the bug or the missing function / the expert fix / what the hidden tests add):

====================  ==========================================================================================
`fix-off-by-one`      a loop bound one off: skips the last or the first element, or leaves out the end of an
                      inclusive range / `sed` of the `for ... range(...)` line / empty and one-element lists,
                      empty and one-number ranges
`fix-comparison`      `>` for `>=`, `<` for `<=` or the reverse, in a filter or a count against a limit / `sed` of
                      the comparison line / floats just around the limit, an empty list, all values at the limit
`fix-operator`        a wrong arithmetic operator in a formula (area, average, discount, tax, change, Celsius,
                      midpoint, minutes) / `sed` of the `return` line / zeros, negatives, fresh values
`fix-empty-case`      an empty list crashes (the guard tests `is None`) or gets the wrong value / `sed` of the
                      guard or of its `return` / one-element lists, negatives, the empty list
`fix-swapped-args`    a helper (percent, power, elapsed time) called with its two arguments swapped / `sed` of the
                      call / zero, equal arguments, fresh values
`fix-string-method`   the wrong `str` method (`upper` for `lower`, `lstrip` for `strip`, `startswith` for
                      `endswith`, `capitalize` for `title`) / `sed` of the call / empty and blank strings,
                      upper case, tricky suffixes
`fix-dict-key`        a dict read with the wrong key (a sum over records, a setting with a default) / `sed` of the
                      key / no records, a missing key, only the wrong key present
`implement-function`  a function that raises `NotImplementedError` (clamp, sign, count vowels, dedupe, running
                      total, chunk, palindrome) / `write_file` of the whole module / the docstring's edge cases
                      (bounds, zero, empty input, letter case)
====================  ==========================================================================================

How tasks are drawn: everything comes from `random.Random(f"code-tasks/{seed}")`. It first draws a kind uniformly
from `CODE_KINDS` (used when `kind` is None; drawn anyway, so `code_task(s, code_task(s).kind) == code_task(s)`),
then the module and (one time in three) package names, then the kind's builder draws a variant, the function and
variable names from small word lists, and the test values. The generator runs its correct and buggy code to get the
expected values and draws again until the two visible cases differ, the bug changes the result of one of them (the
one quoted in the instruction), the hidden cases add at least three new arguments and (but for `fix-empty-case`)
the bug changes the result of one of those too. The expert solution is one call (`sed -i` anchored on the whole
buggy line, or `write_file` of the module), then `submit`.

Example:
    >>> task = code_task(0)
    >>> task.kind in CODE_KINDS, task.solution[-1]["name"], len(task.solution)
    (True, 'submit', 2)
    >>> code_task(7, "fix-off-by-one") == code_task(7, "fix-off-by-one")
    True
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .sandbox_tasks import SandboxTask, bash, submit, write_file

CODE_KINDS: tuple[str, ...] = (
    "fix-off-by-one",
    "fix-comparison",
    "fix-operator",
    "fix-empty-case",
    "fix-swapped-args",
    "fix-string-method",
    "fix-dict-key",
    "implement-function",
)

# Names of modules and packages (none shadows a standard-library module).
MODULE_NAMES = (
    "stats", "mathutils", "metrics", "calc", "scores", "tally", "ledger", "helpers", "toolbox", "numtools",
    "textkit", "inventory", "billing", "grades", "report",
)
PACKAGE_NAMES = ("shop", "school", "garden", "depot", "studio", "lab", "clinic", "bakery")
LIST_NAMES = ("values", "items", "nums", "scores", "points", "amounts", "readings", "counts")
LIMIT_NAMES = ("limit", "threshold", "cutoff", "bound", "level")
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "orbit", "candle", "amber", "delta")

Args = tuple[Any, ...]


@dataclass
class _Spec:
    """What a builder draws: the correct function(s), the one line the bug changes (or a stub), and the cases."""

    fn: str  # the function the tests call
    body: list[str]  # the correct module after its docstring, line by line
    visible: list[Args]  # argument tuples of the visible test
    hidden: list[Args]  # more argument tuples for the hidden check
    symptom: str  # "`{fn}` skips the last element"; may use {fn}, {call}, {result}
    hint: str  # one sentence: the bug and the fix
    good: str = ""  # the correct line that the bug replaces (fix kinds)
    bad: str = ""  # the buggy line
    stub: list[str] = field(default_factory=list)  # implement kind: the starting module body


def _ints(rng: random.Random, n: int, lo: int = 1, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _off_by_one(rng: random.Random) -> _Spec:
    xs = rng.choice(LIST_NAMES)
    variant = rng.randrange(3)
    if variant == 0:
        fn = rng.choice(("total", "sum_all", "add_up", "grand_total", "sum_values"))
        body = [
            f"def {fn}({xs}):",
            f'    """Return the sum of all the numbers in {xs}."""',
            "    total = 0",
            f"    for i in range(len({xs})):",
            f"        total += {xs}[i]",
            "    return total",
        ]
        bad = f"    for i in range(len({xs}) - 1):"
        visible = [(_ints(rng, rng.randint(3, 5)),), (_ints(rng, 2),)]
        hidden = [([],), (_ints(rng, 1),), (_ints(rng, 6, -9, 9),), (_ints(rng, 4),)]
        symptom = "`{fn}` skips the last element"
        hint = f"The loop in `{fn}` stops one element early: loop over `range(len({xs}))`, not `range(len({xs}) - 1)`."
    elif variant == 1:
        fn = rng.choice(("count_above", "count_over", "num_above", "how_many_over"))
        lim = rng.choice(LIMIT_NAMES)
        body = [
            f"def {fn}({xs}, {lim}):",
            f'    """Return how many numbers in {xs} are greater than {lim}."""',
            "    count = 0",
            f"    for i in range(len({xs})):",
            f"        if {xs}[i] > {lim}:",
            "            count += 1",
            "    return count",
        ]
        bad = f"    for i in range(1, len({xs})):"
        limit = rng.randint(5, 12)
        visible = [([rng.randint(limit + 1, 20)] + _ints(rng, 3), limit), (_ints(rng, 4), rng.randint(5, 12))]
        hidden = [([], limit), ([limit + 1], limit), ([limit], limit), (_ints(rng, 6, -5, 20), rng.randint(0, 9))]
        symptom = "`{fn}` never looks at the first element"
        hint = f"The loop in `{fn}` starts at index 1: loop over `range(len({xs}))`, not `range(1, len({xs}))`."
    else:
        fn = rng.choice(("sum_between", "range_total", "sum_span", "add_range"))
        lo, hi = rng.choice((("lo", "hi"), ("start", "end"), ("first", "last"), ("low", "high")))
        body = [
            f"def {fn}({lo}, {hi}):",
            f'    """Return the sum of the whole numbers from {lo} to {hi}, both included."""',
            "    total = 0",
            f"    for n in range({lo}, {hi} + 1):",
            "        total += n",
            "    return total",
        ]
        bad = f"    for n in range({lo}, {hi}):"
        a = rng.randint(1, 6)
        visible = [(a, a + rng.randint(2, 6)), (rng.randint(0, 3), rng.randint(4, 9))]
        b = rng.randint(-5, 5)
        hidden = [(b, b), (b + 3, b), (-rng.randint(1, 5), rng.randint(1, 5)), (rng.randint(1, 9), rng.randint(10, 15))]
        symptom = f"`{{fn}}` leaves out `{hi}`, the upper end of the range"
        hint = f"`range({lo}, {hi})` stops before `{hi}`: loop over `range({lo}, {hi} + 1)`."
    good = body[3]  # the `for` line
    return _Spec(fn, body, visible, hidden, symptom, hint, good=good, bad=bad)


_COMPARISONS = (  # correct operator, buggy operator, words, function names
    (">=", ">", "at least", ("at_least", "keep_min", "passing", "big_enough")),
    ("<=", "<", "at most", ("at_most", "keep_max", "small_enough", "within")),
    (">", ">=", "greater than", ("above", "greater_than", "over")),
    ("<", "<=", "less than", ("below", "less_than", "under")),
)


def _comparison(rng: random.Random) -> _Spec:
    op, bad_op, words, names = rng.choice(_COMPARISONS)
    xs, lim = rng.choice(LIST_NAMES), rng.choice(LIMIT_NAMES)
    count = rng.random() < 0.5
    fn = ("count_" if count else "") + rng.choice(names)
    if count:
        doc = f"Return how many numbers in {xs} are {words} {lim}."
        line = "    return sum(1 for x in {xs} if x {op} {lim})"
    else:
        doc = f"Return the numbers in {xs} that are {words} {lim}, in order."
        line = "    return [x for x in {xs} if x {op} {lim}]"
    good, bad = line.format(xs=xs, op=op, lim=lim), line.format(xs=xs, op=bad_op, lim=lim)
    body = [f"def {fn}({xs}, {lim}):", f'    """{doc}"""', good]
    limit = rng.randint(5, 15)
    row = _ints(rng, 4, 0, 20) + [limit]
    rng.shuffle(row)
    visible = [(row, limit), (_ints(rng, 3, 0, 20), rng.randint(5, 15))]
    hidden = [
        ([limit - 0.5, limit, limit + 0.5], limit),
        ([], limit),
        ([limit] * 3, limit),
        (_ints(rng, 6, -10, 20) + [limit + 1, limit - 1], limit),
    ]
    symptom = "`{fn}` gets values equal to the limit wrong: `{call}` {result}"
    hint = f"`{fn}` compares with `{bad_op}` but must keep the numbers {words} `{lim}`: use `x {op} {lim}`."
    return _Spec(fn, body, visible, hidden, symptom, hint, good=good, bad=bad)


def _money(rng: random.Random) -> Args:
    return (20 * rng.randint(1, 10), 5 * rng.randint(1, 8))


_FORMULAS: tuple[tuple[tuple[str, ...], str, str, str, str, Callable[[random.Random], Args], tuple[Args, ...]], ...] = (
    # names, parameters, what it returns, correct expression, buggy expression, argument drawer, edge cases
    (("area", "rect_area", "area_of"), "width, height", "the area of a width by height rectangle",
     "width * height", "width + height", lambda r: (r.randint(3, 15), r.randint(3, 15)), ((0, 5), (1, 1))),
    (("average", "mean_of", "per_item"), "total, count", "total divided by count",
     "total / count", "total * count", lambda r: (r.randint(10, 90), r.randint(2, 9)), ((0, 4), (7, 1))),
    (("discounted", "sale_price", "after_discount"), "price, percent", "price after taking percent % off",
     "price - price * percent / 100", "price + price * percent / 100", _money, ((50, 0), (80, 100))),
    (("with_tax", "gross_price", "add_tax"), "price, rate", "price plus rate % of tax",
     "price + price * rate / 100", "price - price * rate / 100", _money, ((0, 20), (40, 0))),
    (("change_due", "change", "give_back"), "paid, cost", "the change when paying paid for a cost of cost",
     "paid - cost", "paid + cost", lambda r: (r.randint(20, 50), r.randint(1, 19)), ((10, 10), (0, 0))),
    (("to_celsius", "celsius", "f_to_c"), "fahrenheit", "fahrenheit converted to degrees Celsius",
     "(fahrenheit - 32) * 5 / 9", "(fahrenheit + 32) * 5 / 9", lambda r: (32 + 9 * r.randint(1, 12),), ((32,), (-40,))),
    (("midpoint", "middle", "halfway"), "a, b", "the number halfway between a and b",
     "(a + b) / 2", "(a - b) / 2", lambda r: (r.randint(-5, 10), r.randint(11, 30)), ((4, 4), (-6, 2))),
    (("to_minutes", "minutes_in", "as_minutes"), "hours", "hours converted to minutes",
     "hours * 60", "hours / 60", lambda r: (r.randint(2, 12),), ((0,), (-1,))),
)


def _operator(rng: random.Random) -> _Spec:
    names, params, doc, expr, bad_expr, draw, edges = rng.choice(_FORMULAS)
    fn = rng.choice(names)
    body = [f"def {fn}({params}):", f'    """Return {doc}."""', f"    return {expr}"]
    visible = [draw(rng), draw(rng)]
    hidden = [*edges, draw(rng), draw(rng), draw(rng)]
    hint = f"`{fn}` computes `{bad_expr}` but must return {doc}: `{expr}`."
    return _Spec(fn, body, visible, hidden, "`{call}` {result}", hint, good=body[-1], bad=f"    return {bad_expr}")


_EMPTY_CASES = (  # what it returns, expression, value for an empty list, function names
    ("mean", "sum({xs}) / len({xs})", 0.0, ("mean", "average_of", "avg")),
    ("largest number", "max({xs})", None, ("largest", "biggest", "top_value")),
    ("smallest number", "min({xs})", None, ("smallest", "lowest", "min_value")),
    ("largest minus the smallest number", "max({xs}) - min({xs})", 0, ("spread", "value_range", "span_of")),
    ("last number", "{xs}[-1]", None, ("last", "latest", "final_value")),
)


def _empty_case(rng: random.Random) -> _Spec:
    desc, expr, empty, names = rng.choice(_EMPTY_CASES)
    xs, fn = rng.choice(LIST_NAMES), rng.choice(names)
    body = [
        f"def {fn}({xs}):",
        f'    """Return the {desc} of {xs}, or {empty!r} if {xs} is empty."""',
        f"    if not {xs}:",
        f"        return {empty!r}",
        f"    return {expr.format(xs=xs)}",
    ]
    if rng.random() < 0.5:  # the guard tests the wrong thing: the empty list falls through and crashes
        good, bad = body[2], f"    if {xs} is None:"
        hint = f"`{fn}` checks `{xs} is None`, so an empty list crashes: test `if not {xs}:` instead."
    else:  # the guard is right but returns the wrong value
        wrong = "0" if empty is None else "None"
        good, bad = body[3], f"        return {wrong}"
        hint = f"`{fn}` returns `{wrong}` for an empty list where its docstring says `{empty!r}`: return that."
    visible = [(_ints(rng, rng.randint(2, 5)),), ([],)]
    hidden = [([rng.randint(-9, 9)],), (_ints(rng, 5, -20, 20),), (_ints(rng, 3, 1, 99),)]
    return _Spec(fn, body, visible, hidden, "`{call}` {result}", hint, good=good, bad=bad)


def _swapped_args(rng: random.Random) -> _Spec:
    variant = rng.randrange(3)
    if variant == 0:
        helper = rng.choice(("percent", "pct", "as_percent"))
        fn = rng.choice(("progress", "completion", "done_ratio", "share"))
        done, total = rng.choice((("done", "total"), ("passed", "count"), ("used", "capacity")))
        body = [
            f"def {helper}(part, whole):",
            '    """Return part as a percentage of whole."""',
            "    return 100 * part / whole",
            "",
            "",
            f"def {fn}({done}, {total}):",
            f'    """Return {done} as a percentage of {total}, rounded to one decimal."""',
            f"    return round({helper}({done}, {total}), 1)",
        ]
        bad = f"    return round({helper}({total}, {done}), 1)"
        visible = [(rng.randint(1, 9), rng.randint(10, 40)), (rng.randint(1, 30), rng.randint(31, 90))]
        t = rng.randint(2, 50)
        hidden = [(0, t), (t, t), (2 * t, t), (rng.randint(1, 7), rng.randint(8, 60))]
    elif variant == 1:
        helper = rng.choice(("power", "pow_of", "raise_to"))
        k = rng.randint(2, 4)
        fn = rng.choice({2: ("square", "squared"), 3: ("cube", "cubed"), 4: ("fourth_power", "pow4")}[k])
        x = rng.choice(("x", "n", "side", "value"))
        body = [
            f"def {helper}(base, exponent):",
            '    """Return base raised to the power exponent."""',
            "    return base ** exponent",
            "",
            "",
            f"def {fn}({x}):",
            f'    """Return {x} to the power {k}."""',
            f"    return {helper}({x}, {k})",
        ]
        bad = f"    return {helper}({k}, {x})"
        visible = [(rng.randint(5, 9),), (rng.randint(5, 12),)]
        hidden = [(0,), (1,), (-rng.randint(2, 6),), (k,), (rng.randint(13, 20),)]
    else:
        helper = rng.choice(("elapsed", "span", "time_between"))
        fn = rng.choice(("session_cost", "charge", "bill"))
        rate = rng.choice(("rate", "price", "fee"))
        body = [
            f"def {helper}(start, end):",
            '    """Return the time from start to end."""',
            "    return end - start",
            "",
            "",
            f"def {fn}(start, end, {rate}):",
            f'    """Return the cost of a session from start to end at {rate} per minute."""',
            f"    return {helper}(start, end) * {rate}",
        ]
        bad = f"    return {helper}(end, start) * {rate}"
        s = rng.randint(0, 30)
        visible = [(s, s + rng.randint(5, 30), rng.randint(2, 5)), (rng.randint(0, 9), rng.randint(10, 60), 1)]
        hidden = [(s, s, 3), (0, rng.randint(1, 9), 0), (rng.randint(10, 20), rng.randint(40, 99), rng.randint(2, 9))]
    hint = f"`{fn}` calls `{helper}` with its two arguments swapped: write `{body[-1].strip()}`."
    return _Spec(fn, body, visible, hidden, "`{call}` {result}", hint, good=body[-1], bad=bad)


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.sample(WORDS, n))


def _string_method(rng: random.Random) -> _Spec:
    variant = rng.randrange(4)
    s = rng.choice(("text", "name", "tag", "label"))
    if variant == 0:
        fn = rng.choice(("normalize", "clean_tag", "canonical", "tidy_name"))
        doc, good, bad = (f"Return {s} without the spaces around it, in lower case.",
                          f"    return {s}.strip().lower()", f"    return {s}.strip().upper()")
        visible = [("  " + rng.choice(WORDS).capitalize() + " ",), (_phrase(rng, 2).title(),)]
        hidden = [("",), ("   ",), (_phrase(rng, 2).upper() + "  ",), ("x",), ("\t" + rng.choice(WORDS) + "\n",)]
    elif variant == 1:
        fn = rng.choice(("trim", "strip_spaces", "clean"))
        doc, good, bad = (f"Return {s} without spaces at either end.", f"    return {s}.strip()",
                          f"    return {s}.lstrip()")
        visible = [(" " + rng.choice(WORDS) + "   ",), (rng.choice(WORDS) + " ",)]
        hidden = [("",), ("    ",), (_phrase(rng, 2),), ("  " + _phrase(rng, 3) + "  ",)]
    elif variant == 2:
        fn = rng.choice(("has_extension", "is_type", "ends_in_ext"))
        s, ext = rng.choice((("filename", "ext"), ("path", "suffix"), ("name", "kind")))
        doc = f"Return True if {s} ends with a dot and then {ext}."
        good, bad = f'    return {s}.endswith("." + {ext})', f'    return {s}.startswith("." + {ext})'
        e = rng.choice(("txt", "csv", "py", "md", "json"))
        visible = [(rng.choice(WORDS) + "." + e, e), (rng.choice(WORDS) + ".log", e)]
        hidden = [("." + e, e), (e, e), (e + ".bak", e), (f"{rng.choice(WORDS)}.{e}.bak", e),
                  (f"{rng.choice(WORDS)}.old.{e}", e), ("", e)]
    else:
        fn = rng.choice(("title_case", "headline", "capitalize_words"))
        doc, good, bad = (f"Return {s} with every word capitalized: first letter upper case, the rest lower case.",
                          f"    return {s}.title()", f"    return {s}.capitalize()")
        visible = [(_phrase(rng, 2),), (_phrase(rng, 3),)]
        hidden = [("",), (rng.choice(WORDS),), (_phrase(rng, 2).upper(),), ("a b c",)]
    body = [f"def {fn}({s}{', ' + ext if variant == 2 else ''}):", f'    """{doc}"""', good]
    hint = f"`{fn}` calls the wrong string method: `{bad.strip()}` must be `{good.strip()}`."
    return _Spec(fn, body, visible, hidden, "`{call}` {result}", hint, good=good, bad=bad)


_RECORDS = (  # list name, item name, numeric keys
    ("orders", "order", ("price", "quantity", "weight")),
    ("students", "student", ("score", "age", "absences")),
    ("trips", "trip", ("distance", "duration", "stops")),
    ("boxes", "box", ("weight", "volume", "count")),
)
_SETTINGS = ("timeout", "retries", "port", "workers", "depth", "delay")


def _dict_key(rng: random.Random) -> _Spec:
    if rng.random() < 0.5:
        rows, row, keys = rng.choice(_RECORDS)
        key, wrong = rng.sample(keys, 2)
        fn = rng.choice((f"total_{key}", f"sum_{key}", f"{key}_total"))
        body = [
            f"def {fn}({rows}):",
            f'    """Return the sum of the "{key}" values of {rows} (a list of dicts)."""',
            f'    return sum({row}["{key}"] for {row} in {rows})',
        ]
        bad = f'    return sum({row}["{wrong}"] for {row} in {rows})'

        def record() -> dict[str, int]:
            return {k: rng.randint(1, 50) for k in keys}

        visible = [([record(), record()],), ([record(), record(), record()],)]
        hidden = [([],), ([record()],), ([record() for _ in range(5)],)]
    else:
        key, wrong = rng.sample(_SETTINGS, 2)
        default = rng.randint(1, 9)
        const = f"DEFAULT_{key.upper()}"
        fn = rng.choice((f"get_{key}", f"{key}_setting", f"read_{key}"))
        body = [
            f"{const} = {default}",
            "",
            "",
            f"def {fn}(settings):",
            f'    """Return settings["{key}"], or {const} when settings has no "{key}"."""',
            f'    return settings.get("{key}", {const})',
        ]
        bad = f'    return settings.get("{wrong}", {const})'
        v = rng.randint(10, 60)
        visible = [({key: v, wrong: v + rng.randint(1, 9)},), ({},)]
        hidden = [({wrong: rng.randint(10, 60)},), ({key: rng.randint(61, 99)},), ({key: 0, wrong: 5, "name": "x"},)]
    hint = f"`{fn}` reads the key \"{wrong}\" where it must read \"{key}\": write `{body[-1].strip()}`."
    return _Spec(fn, body, visible, hidden, "`{call}` {result}", hint, good=body[-1], bad=bad)


_IMPLEMENT: tuple[tuple[tuple[str, ...], str, list[str], list[str], Callable[[random.Random], list[Args]],
                        Callable[[random.Random], list[Args]]], ...] = (
    # names, parameters, docstring lines, body lines, visible cases, hidden cases
    (("clamp", "bound", "limit_to", "clip"), "value, low, high",
     ["Return value limited to the range from low to high (low <= high).",
      "",
      "Below low gives low, above high gives high, anything in between is returned unchanged."],
     ["return max(low, min(value, high))"],
     lambda r: [(r.randint(3, 7), 1, 9), (r.randint(12, 30), 0, 10)],
     lambda r: [(-r.randint(1, 9), 0, 10), (0, 0, 10), (10, 0, 10), (5, 5, 5), (r.randint(-30, 30), -20, 20),
                (2.5, 1, 3)]),
    (("sign", "signum", "sign_of"), "x",
     ["Return 1 if x is positive, -1 if it is negative and 0 if it is zero."],
     ["return (x > 0) - (x < 0)"],
     lambda r: [(r.randint(1, 99),), (-r.randint(1, 99),)],
     lambda r: [(0,), (0.5,), (-0.25,), (r.randint(100, 999),), (-r.randint(100, 999),)]),
    (("count_vowels", "vowel_count", "num_vowels"), "text",
     ["Return how many letters of text are vowels (a, e, i, o, u), in upper or lower case."],
     ['return sum(1 for c in text.lower() if c in "aeiou")'],
     lambda r: [(_phrase(r, 2),), (r.choice(WORDS),)],
     lambda r: [("",), ("rhythm",), (_phrase(r, 3).upper(),), ("AeIoU xyz",)]),
    (("dedupe", "unique", "distinct"), "items",
     ["Return a new list of items without repeats, each item kept at its first position."],
     ["return list(dict.fromkeys(items))"],
     lambda r: [([3, 1, 3, 2, 1],), (_ints(r, 6, 1, 4),)],
     lambda r: [([],), ([7, 7, 7],), (_ints(r, 8, 1, 5),), (r.sample(WORDS, 3) * 2,)]),
    (("running_total", "cumulative", "prefix_sums"), "values",
     ["Return the list of running sums: element i is the sum of values[0] up to values[i]."],
     ["sums, total = [], 0", "for v in values:", "    total += v", "    sums.append(total)", "return sums"],
     lambda r: [(_ints(r, 4),), (_ints(r, 3),)],
     lambda r: [([],), ([r.randint(1, 9)],), (_ints(r, 6, -9, 9),)]),
    (("chunk", "batches", "split_into"), "items, size",
     ["Split items into lists of size items each (size >= 1); the last list may be shorter."],
     ["return [items[i:i + size] for i in range(0, len(items), size)]"],
     lambda r: [(_ints(r, 6), 2), (_ints(r, 7), 3)],
     lambda r: [([], 3), (_ints(r, 2), 5), (_ints(r, 4), 4), (_ints(r, 5), 1), (_ints(r, 9), 4)]),
    (("is_palindrome", "reads_same", "palindromic"), "text",
     ["Return True if text reads the same backwards, ignoring case and spaces."],
     ['letters = text.replace(" ", "").lower()', "return letters == letters[::-1]"],
     lambda r: [(r.choice(("Step on no pets", "Never odd or even", "Top spot")),), (r.choice(WORDS),)],
     lambda r: [("",), ("ab",), ("Abba",), (r.choice(WORDS),), ("Was it a car or a cat I saw",), ("abca",)]),
)


def _implement(rng: random.Random) -> _Spec:
    names, params, doc, code, draw_visible, draw_hidden = rng.choice(_IMPLEMENT)
    fn = rng.choice(names)
    head = [f"def {fn}({params}):", f'    """{doc[0]}'] + [f"    {line}".rstrip() for line in doc[1:]]
    head[-1] += '"""' if len(doc) == 1 else '\n    """'
    body = head + [f"    {line}" for line in code]
    stub = head + ["    raise NotImplementedError"]
    how = "; ".join(line.strip() for line in code).replace(":;", ":")  # "for v in values: total += v; ..."
    hint = f"`{fn}` only raises NotImplementedError: write its body as the docstring says, e.g. `{how}`."
    return _Spec(fn, body, draw_visible(rng), draw_hidden(rng), "", hint, stub=stub)


_BUILDERS: dict[str, Callable[[random.Random], _Spec]] = {
    "fix-off-by-one": _off_by_one,
    "fix-comparison": _comparison,
    "fix-operator": _operator,
    "fix-empty-case": _empty_case,
    "fix-swapped-args": _swapped_args,
    "fix-string-method": _string_method,
    "fix-dict-key": _dict_key,
    "implement-function": _implement,
}


def _load(source: str, fn: str) -> Callable[..., Any]:
    """The function `fn` of a module source generated here (our own template code, run on the host)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<code-task>", "exec"), namespace)
    return namespace[fn]


def _call(f: Callable[..., Any], args: Args) -> tuple[bool, Any]:
    try:
        return True, f(*args)
    except Exception as error:  # noqa: BLE001  the buggy code may raise anything
        return False, error


def _passes(f: Callable[..., Any], args: Args, want: Any) -> bool:
    """Whether `f(*args)` gives `want`, as the hidden check compares (floats within 1e-9)."""
    ok, got = _call(f, args)
    if not ok:
        return False
    if isinstance(want, float):
        return isinstance(got, (int, float)) and abs(got - want) < 1e-9
    return got == want


def _show(value: Any) -> str:
    return repr(round(value, 4)) if isinstance(value, float) else repr(value)


def _sed_pattern(text: str) -> str:
    for char in "\\/.*[]^$":
        text = text.replace(char, "\\" + char)
    return text


def _sed(path: str, old: str, new: str) -> str:
    """`sed -i` replacing the whole line `old` (anchored at both ends) by `new` in `path`."""
    assert "'" not in old + new and "\n" not in old + new
    replacement = new.replace("\\", "\\\\").replace("&", "\\&").replace("/", "\\/")
    return f"sed -i 's/^{_sed_pattern(old)}$/{replacement}/' {path}"


def _test_file(module: str, fn: str, cases: list[tuple[Args, Any]]) -> str:
    asserts = [
        f"        self.{'assertAlmostEqual' if isinstance(want, float) else 'assertEqual'}"
        f"({fn}({', '.join(map(repr, args))}), {want!r})"
        for args, want in cases
    ]
    camel = "".join(part.capitalize() for part in fn.split("_"))
    return "\n".join([
        "import unittest", "", f"from {module} import {fn}", "", "",
        f"class Test{camel}(unittest.TestCase):", f"    def test_{fn}(self):", *asserts, "", "",
        'if __name__ == "__main__":', "    unittest.main()", "",
    ])


_CHECK = """import importlib, os, sys
sys.dont_write_bytecode = True
sys.pycache_prefix = "/dev/null/pycache"  # never read a stale __pycache__
sys.path.insert(0, os.getcwd())
f = importlib.import_module({module!r}).{fn}
for args, want in [
{cases}
]:
    got = f(*args)
    if isinstance(want, float):
        assert isinstance(got, (int, float)) and abs(got - want) < 1e-9, (args, got, want)
    else:
        assert got == want, (args, got, want)
"""


def code_task(seed: int, kind: str | None = None) -> SandboxTask:
    """The code task of `seed`: a small project whose visible unittest fails, a hidden check and an expert solution.

    Args:
        seed: Any integer; the same seed (and kind) always gives the same task.
        kind: One of `CODE_KINDS`, or None to draw the kind uniformly from the seed.

    Returns:
        A `SandboxTask` whose `files` hold the module and `test_<module>.py`; its `check` fails on these files and
        passes once the expert `solution` (one `sed -i` or `write_file`, then `submit`) has been replayed.
    """
    rng = random.Random(f"code-tasks/{seed}")
    drawn = rng.choice(CODE_KINDS)
    kind = drawn if kind is None else kind
    if kind not in _BUILDERS:
        raise ValueError(f"unknown code task kind {kind!r}; expected one of {', '.join(CODE_KINDS)}")
    name = rng.choice(MODULE_NAMES)
    package = rng.choice(PACKAGE_NAMES) if rng.random() < 1 / 3 else None
    module, path = (f"{package}.{name}", f"{package}/{name}.py") if package else (name, f"{name}.py")
    test_path = f"test_{name}.py"
    header = [f'"""{name.capitalize()}: small helpers."""', "", ""]
    # Draw until the visible cases differ, the hidden ones add at least 3, a visible case shows the bug, and (but for
    # the empty case, whose bug shows only on []) so does an added one: special-casing the visible values fails.
    for _ in range(50):
        spec = _BUILDERS[kind](rng)
        source = "\n".join(header + spec.body) + "\n"
        if spec.stub:
            start = "\n".join(header + spec.stub) + "\n"
        else:
            assert source.count(spec.good + "\n") == 1 and spec.bad not in source, (kind, spec.good)
            start = source.replace(spec.good + "\n", spec.bad + "\n")
        right, wrong = _load(source, spec.fn), _load(start, spec.fn)
        wants = [right(*args) for args in spec.visible]
        shown = next((i for i, args in enumerate(spec.visible) if not _passes(wrong, args, wants[i])), None)
        seen = {repr(args) for args in spec.visible}
        extra = [args for args in spec.hidden if not (repr(args) in seen or seen.add(repr(args)))]
        hidden_shows = kind == "fix-empty-case" or any(not _passes(wrong, a, right(*a)) for a in extra)
        distinct = len(set(map(repr, spec.visible))) == len(spec.visible) and len(extra) >= 3
        if shown is not None and distinct and hidden_shows:
            break
    else:  # pragma: no cover - every builder shows its bug within a few draws
        raise RuntimeError(f"could not draw a {kind} task for seed {seed}")
    cases = [(args, right(*args)) for args in spec.visible + extra]
    files = {path: start, test_path: _test_file(module, spec.fn, list(zip(spec.visible, wants)))}
    if package:
        files[f"{package}/__init__.py"] = ""
    check = _CHECK.format(
        module=module, fn=spec.fn, cases="\n".join(f"    ({args!r}, {want!r})," for args, want in cases)
    )
    if spec.stub:
        instruction = (f"Implement `{spec.fn}` in {path} as its docstring says, so that `python3 -m unittest` "
                       f"passes (the test is in {test_path}).")
        solution = (write_file(path, source), submit())
    else:
        ok, got = _call(wrong, spec.visible[shown])
        result = (f"returns {_show(got)} instead of {_show(wants[shown])}" if ok else
                  f"raises {type(got).__name__} instead of returning {_show(wants[shown])}")
        call = f"{spec.fn}({', '.join(map(repr, spec.visible[shown]))})"
        symptom = spec.symptom.format(fn=spec.fn, call=call, result=result)
        instruction = (f"The test in {test_path} fails: {symptom}. Fix the bug in {path} so that "
                       "`python3 -m unittest` passes.")
        solution = (bash(_sed(path, spec.bad, spec.good)), submit())
    return SandboxTask(kind=kind, instruction=instruction, files=files, solution=solution, check=check,
                       hint=spec.hint)
