"""Op tokens of schedule files (``2F0``, ``3I1``), read within the size limits: a stage
below MAX_STAGES, a microbatch below MAX_MICROBATCHES, and nothing long enough to be a
number Python refuses to read."""

from __future__ import annotations

from pipesched.errors import PipeschedError, shorten
from pipesched.limits import MAX_MICROBATCHES, MAX_NUMBER_CHARS, MAX_OPS, MAX_STAGES
from pipesched.ops import Op, UnknownKindError
from pipesched.rules import RULES, Rules


def max_op_chars(rules: Rules) -> int:
    """The longest op text of ``rules``: a fused pair of two stepped ops (stage, microbatch
    and step each a number of MAX_NUMBER_CHARS digits), every kind of the longest name."""
    plain = 3 * MAX_NUMBER_CHARS + len(".") + rules.longest_name
    return 2 * plain + len("(;)") + rules.longest_name


def read_op(token: str, *, where: str, hint: str, label: str = "op token", rules: Rules = RULES) -> Op:
    """The op ``token`` names, of a kind of ``rules``; otherwise a PipeschedError at ``where``
    (``file:line:col``) saying "bad ``label``" with ``hint`` (what a good token looks like),
    or, for a well-formed token of a kind the rules lack, which kinds they have."""
    op = None
    if len(token) <= max_op_chars(rules):
        try:
            op = Op.parse(token, rules)
        except UnknownKindError as error:
            raise PipeschedError(f"{where}: bad {label} {shorten(token)!r}: {error.reason}") from None
        except PipeschedError:
            op = None
    if op is None:
        raise PipeschedError(f"{where}: bad {label} {shorten(token)!r}; {hint}")
    if op.stage >= MAX_STAGES:
        raise PipeschedError(f"{where}: op {token}: stage {op.stage} is over the limit of {MAX_STAGES:,} stages "
                             f"(0..{MAX_STAGES - 1})")
    if op.microbatch >= MAX_MICROBATCHES:
        raise PipeschedError(f"{where}: op {token}: microbatch {op.microbatch} is over the limit of "
                             f"{MAX_MICROBATCHES:,} microbatches (0..{MAX_MICROBATCHES - 1})")
    return op


def check_op_count(count: int, source: str) -> None:
    """Refuse a file holding more than MAX_OPS ops (called as they are read)."""
    if count > MAX_OPS:
        raise PipeschedError(f"{source}: more than {MAX_OPS:,} ops, over the limit of one schedule; "
                             "give a smaller schedule")
