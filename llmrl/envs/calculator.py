"""The built-in `calculator` environment: one tool that evaluates integer arithmetic.

Only integers, + − * // % ( ) and unary minus are evaluated (an `ast` walk, never `eval`); anything
else, or a number past 10^30, is an error the model reads back.
"""

from __future__ import annotations

import ast
import operator

from .base import register_env
from .tools import ToolEnv

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod}
LIMIT = 10**30


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        v = _OPS[type(node.op)](left, right)
        if abs(v) > LIMIT:
            raise ValueError("the result is too large")
        return v
    raise ValueError("only integers and + - * // % ( ) are allowed")


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers with + - * // % and parentheses, e.g. "347*28".
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    return str(_value(tree.body))


@register_env("calculator")
def calculator_env(timeout_s: float = 5.0) -> ToolEnv:
    """Tools: calculator(expression). A turn without a call is the answer."""
    return ToolEnv([calculator], timeout_s)
