"""Another user's JSON is read with bounds (memgov/_ledger/parse.py): its nesting is judged without
recursion, brackets inside strings not counted, a text of few brackets without a walk."""

from __future__ import annotations

import json

import pytest

from memgov._ledger.parse import MAX_DEPTH, load_bounded, too_deep


def walked(text: str) -> int:
    """The nesting depth by a plain character walk (strings and escapes skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


CASES = [
    '{"pid": 12, "tags": ["a", "b"]}',
    "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "[" * MAX_DEPTH + "]" * MAX_DEPTH,
    '{"s": "[[[[[[[[[[[[[[[["}',
    '{"s": "\\"[[[[[[[[[[[[\\"", "t": [[[]]]}',
    '[{"x": "\\\\"}, ' + "[" * 8 + "]" * 8 + "]",
    '["\\\\\\"[[[[[[[[[[", {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}]',
]


@pytest.mark.parametrize("text", CASES)
def test_the_depth_is_judged_as_a_character_walk_judges_it(text: str) -> None:
    json.loads(text)  # every case is valid JSON
    assert too_deep(text) == (walked(text) > MAX_DEPTH)
    assert too_deep(text, 2) == (walked(text) > 2)
    _value, why = load_bounded(text.encode())
    assert (why is not None) == (walked(text) > MAX_DEPTH)
    assert why is None or f"deeper than {MAX_DEPTH}" in why
