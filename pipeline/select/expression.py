"""A ``--where`` expression: SQL WHERE text parsed by sqlglot into a pyarrow compute
expression, through a whitelist of node types (never ``eval``).

What is taken: column references (``lang``, ``"fasttext.hq"`` quoted, or ``fasttext.hq``
unquoted: the parts joined by dots), string, number, boolean and NULL literals, the six
comparisons, ``AND``/``OR``/``NOT``, ``IN (...)`` of literals, ``IS [NOT] NULL``,
``BETWEEN``, ``LIKE``/``ILIKE``, ``+ - * /`` and unary minus, parentheses. Anything else (a
function call, a sub-query, a cast, a statement) is refused with one error naming it, as is a
column the dataset does not have and ``input_ids`` (the token column: a view decides on
signals, never on tokens).

Nulls follow SQL: a comparison with NULL is unknown, and a document whose expression is not
true is not kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

#: the token column: never read by a selection
TOKEN_COLUMN = "input_ids"

_COMPARE: dict[type[exp.Expression], Callable[[pc.Expression, pc.Expression], pc.Expression]] = {
    exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b, exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b, exp.LTE: lambda a, b: a <= b,
    exp.Add: lambda a, b: a + b, exp.Sub: lambda a, b: a - b,
    exp.Mul: lambda a, b: a * b, exp.Div: lambda a, b: a / b,
    exp.And: lambda a, b: a & b, exp.Or: lambda a, b: a | b,
}
ALLOWED = ("columns, literals (string, number, TRUE/FALSE, NULL), = <> != < <= > >=, AND, OR, "
           "NOT, IN (...), IS [NOT] NULL, BETWEEN, LIKE, ILIKE, + - * /, parentheses")


class ExpressionError(ValueError):
    """A ``--where`` that cannot be used: unparsable, an unsupported construct, an unknown
    column, or types that do not compare."""


@dataclass(frozen=True)
class Selection:
    """A parsed ``--where``: its pyarrow expression, the columns it reads, its SQL text."""

    expression: pc.Expression
    columns: tuple[str, ...]
    sql: str

    def keep(self, table: pa.Table) -> pa.BooleanArray:
        """Which rows of ``table`` (holding :attr:`columns`) the expression keeps: true, not
        false or null."""
        if not self.columns:  # a constant: no column to project from, one value per row
            probe = pa.table({"_": pa.nulls(table.num_rows, pa.int8())})
        else:
            probe = table.select(list(self.columns))
        out = ds.dataset(probe).to_table(columns={"keep": self.expression}).column("keep")
        out = out.cast(pa.bool_()) if out.type != pa.bool_() else out
        return pc.fill_null(out, False).combine_chunks()


def _column_name(node: exp.Column) -> str:
    return ".".join(part.name for part in node.parts)


def parse(text: str, schema: Mapping[str, pa.DataType]) -> Selection:
    """``text`` as a :class:`Selection` over columns of ``schema`` (name -> Arrow type);
    checked by evaluating it on an empty table of those types, so a comparison of a string
    with a number fails here, before any shard is read."""
    if not text.strip():
        raise ExpressionError("--where: empty expression")
    try:
        tree = sqlglot.parse_one(text)
    except SqlglotError as exc:
        first = str(exc).splitlines()[0]
        raise ExpressionError(f"--where: cannot parse {text!r}: {first}") from None
    columns: list[str] = []

    def column(node: exp.Column) -> pc.Expression:
        name = _column_name(node)
        if name == TOKEN_COLUMN:
            raise ExpressionError(f"--where: column {name!r} holds the token ids; a selection "
                                  "reads signal and metadata columns only")
        if name not in schema:
            known = ", ".join(sorted(c for c in schema if c != TOKEN_COLUMN))
            raise ExpressionError(f"--where: unknown column {name!r} (the dataset has: "
                                  f"{known})")
        if name not in columns:
            columns.append(name)
        return pc.field(name)

    def literal(node: exp.Expression) -> pa.Scalar:
        if isinstance(node, exp.Literal):
            if node.is_string:
                return pa.scalar(node.this)
            number = node.this
            try:
                return pa.scalar(int(number))
            except ValueError:
                return pa.scalar(float(number))
        if isinstance(node, exp.Boolean):
            return pa.scalar(bool(node.this))
        if isinstance(node, exp.Null):
            return pa.scalar(None)
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) \
                and not node.this.is_string:
            return pa.scalar(-literal(node.this).as_py())
        raise ExpressionError(f"--where: {node.sql()!r}: IN takes a list of literals")

    def walk(node: exp.Expression) -> pc.Expression:
        if isinstance(node, exp.Paren):
            return walk(node.this)
        if isinstance(node, exp.Column):
            return column(node)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            return pc.scalar(literal(node))
        op = _COMPARE.get(type(node))
        if op is not None:
            return op(walk(node.this), walk(node.expression))
        if isinstance(node, exp.Not):
            return ~walk(node.this)
        if isinstance(node, exp.Neg):
            return pc.negate(walk(node.this))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return walk(node.this).is_null()
        if isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
            values = [literal(v) for v in node.expressions]
            kinds = {v.type for v in values if v.is_valid}
            if len(kinds) > 1 and not all(pa.types.is_integer(k) or pa.types.is_floating(k)
                                          for k in kinds):
                raise ExpressionError(f"--where: {node.sql()!r}: IN mixes types")
            kind = pa.float64() if any(pa.types.is_floating(k) for k in kinds) else (
                kinds.pop() if kinds else pa.null())
            this = walk(node.this)
            found = this.isin(pa.array([v.as_py() for v in values], type=kind))
            # SQL: NULL IN (...) is unknown (so NOT of it is too), not false
            return pc.if_else(this.is_valid(), found, pa.scalar(None, pa.bool_()))
        if isinstance(node, exp.Between):
            this = walk(node.this)
            return (this >= walk(node.args["low"])) & (this <= walk(node.args["high"]))
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise ExpressionError(f"--where: {node.sql()!r}: LIKE takes a string pattern")
            return pc.match_like(walk(node.this), pattern.this,
                                 ignore_case=isinstance(node, exp.ILike))
        raise ExpressionError(f"--where: {node.sql()!r} is not supported ({type(node).__name__};"
                              f" an expression may use {ALLOWED})")

    expression = walk(tree)
    selection = Selection(expression, tuple(columns), tree.sql())
    empty = pa.table({c: pa.array([], type=schema[c]) for c in columns} or
                     {"_": pa.array([], type=pa.int8())})
    try:
        out = ds.dataset(empty).to_table(columns={"keep": expression}).column("keep")
    except (pa.ArrowException, TypeError) as exc:
        first = str(exc).splitlines()[0]
        raise ExpressionError(f"--where: {selection.sql!r} does not evaluate over the "
                              f"columns' types ({first})") from None
    if out.type not in (pa.bool_(), pa.null()):
        raise ExpressionError(f"--where: {selection.sql!r} is {out.type}, not a condition "
                              "(true or false per document)")
    return selection
