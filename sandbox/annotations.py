"""Sandbox tier 1, annotations: the one shape an annotation may have.

Owns :func:`annotation_shape`, which :mod:`sandbox.static` reports as ``annotation-shape``.
An annotation is program text that other code may read as a type, and ``typing.get_type_hints``
would ``eval`` it (a string, or the value of a computed annotation such as ``"a" + "b"``, whose
fragments are each harmless to the other rules). Nothing in the project evaluates annotations
(:mod:`contract.records` resolves field types with a fixed resolver); this rule keeps them to
what such a resolver reads, so that no annotation is code.

Plain: names, dotted names, ``None``, ``...``, subscripts of a (dotted) name by plain types or
tuples and lists of them (``dict[str, int]``, ``Callable[[int], str]``), ``|`` of plain types,
and strings (forward references, and every annotation under ``from __future__ import
annotations``) whose parsed text is plain. ``Literal[...]`` may hold constants.

Invariants: pure and deterministic; iterative over one level, strings nest at most 3 deep.
"""

from __future__ import annotations

import ast

from contract.parsing import parse

_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)


def shown(node: ast.AST) -> str:
    text = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def annotation_shape(annotation: ast.expr, depth: int = 0) -> ast.expr | None:
    """The first part of an annotation that is not a plain type, or None if it is one.

    Plain: names, dotted names, ``None``, ``...``, subscripts of a (dotted) name by plain types
    or tuples and lists of them, ``|`` of plain types, and strings (forward references) whose
    parsed text is plain. ``Literal[...]`` may hold constants. Iterative over the top level;
    strings nest at most 3 deep."""
    todo = [annotation]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) or (
            isinstance(node, ast.Constant) and (node.value is None or node.value is Ellipsis)
        ):
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            todo.append(node.value)
            if not isinstance(node.value, ast.Name | ast.Attribute):
                return node
        elif isinstance(node, ast.Subscript):
            if not isinstance(node.value, ast.Name | ast.Attribute):
                return node
            todo.append(node.value)
            args = node.slice.elts if isinstance(node.slice, ast.Tuple | ast.List) else [node.slice]
            literal = getattr(node.value, "id", getattr(node.value, "attr", "")) == "Literal"
            for arg in args:
                if literal and isinstance(arg, ast.Constant):
                    continue
                todo.extend(arg.elts if isinstance(arg, ast.List) else [arg])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            todo += [node.left, node.right]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and depth < 3:
            try:
                inner = parse(node.value.strip(), mode="eval").body
            except _PARSE_ERRORS:
                return node
            if annotation_shape(inner, depth + 1) is not None:
                return node
        else:
            return node
    return None
