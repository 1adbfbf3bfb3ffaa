"""The rules of op kinds, in one table read by everything else.

For every op kind: which ops it needs (on its own stage and on the neighbour stages), which
of those inputs cross a stage boundary as a message (an activation going forward, a
gradient going back), what it costs (a ``StageCosts`` field), and what it does to the
memory its stage-microbatch holds. The schedule's data dependencies, the validator, the
slot table, the simulator's compiled task graph, the memory trace, the communication pass
and the greedy generators all read this table; a new kind (a fused pair, an offload, a
decode step) is one more entry plus the generators that emit it.

Memory. A stage-microbatch's activations are M_B bytes (``StageCosts.activation_bytes``)
from the start of its F. A full backward B frees all of them when it ends. A split backward
frees them in two parts: I frees what only the input gradient needed (``input_frees`` x
M_B) and W, which still needs the layer inputs, frees the rest, M_W = (1 - input_frees) x
M_B; I also leaves the gradients W consumes (the output gradient of every weight matmul,
K = ``StageCosts.kept_for_w_bytes``), held from I's end to W's. Each kind's effect is
``whole x M_B + input_part x input_frees x M_B + kept x K`` bytes, at the start of the op
(an allocation: the forward builds its activations up) or at its end (a free). Counted in stage-microbatches in flight (M_B = 1, input_frees = 0), F adds one and
the op that ends the backward (B, or W when split) takes it back.

Fused kinds. A kind with ``parts`` is a fused op (``OVERLAP_F_B``: one forward and one
backward of the same device running at once, DualPipe's F&B): one entry of a device's table
made of plain ops of the listed kinds, in that order. It has no needs, messages or memory
effect of its own: it needs what its parts need (the union, less what one part would take
from the other, which a fused op may not do), sends what its parts send once it ends, and
changes memory as its parts do (the forward's allocation when it starts, the backward's
frees when it ends). It holds its device for its ``cost``: ``StageCosts.fused_time``, the
parts' times less the part that overlaps. Completeness counts its parts.

Dependencies (the default table):

    F(s, mb)    needs F(s-1, mb)                  the activation it consumes
    I(s, mb)    needs F(s, mb) and I/B(s+1, mb)   its own activations and the output gradient
    B(s, mb)    needs F(s, mb) and I/B(s+1, mb)
    W(s, mb)    needs I(s, mb)                    the layer inputs and output gradient I kept

A need outside the model (stage -1 or S) is no need: stage 0's F reads the batch, the last
stage's backward starts from the loss. Every stage-microbatch runs exactly one of the
``complete`` sets of kinds: {F, B} or {F, I, W}, plus, all or none, each of the
``optional`` groups: {O, R}, an activation offload and its reload.

Steps. A kind may run several times per stage-microbatch, at steps 1, 2, ... (``Op.step``:
a decode step of a request). A need with ``step_offset`` -1 reads the previous step of the
same microbatch (on the stage its ``offset`` says), and a memory effect's ``per_step`` part
grows with the step. The default table has no such kind; a table that has one is
``stepped``, and completeness then counts a stage-microbatch's kinds over all its steps.

Offload. O(s, mb) needs F(s, mb) and moves its activations to host memory (device bytes
freed when it ends, host bytes taken when it starts); R(s, mb) needs O(s, mb) and brings
them back (device bytes taken when it starts, host bytes freed when it ends). The backward
then needs R instead of F (the first kind of its need the table has). Both run on the
device's host-link stream (``stream``), beside the compute stream, and cost the transfer of
the stage's activation bytes over the host link (``cost`` HOST_TRANSFER).

Frozen stages. A schedule names the stages whose layers are all frozen
(``Schedule.frozen``); each stage then has a role (``stage_roles``):

    TRAINS          it trains its weights: every kind runs
    INPUT_GRADIENT  frozen, but some stage before it trains: it computes the gradient of
                    its input and no weight gradient (no W; a B costs what I costs)
    FORWARD_ONLY    frozen with every stage before it frozen: no backward at all

Each kind says on which stages it runs (``runs_on``); the complete sets of a role are the
complete sets with the kinds it drops left out ({F, B} and {F, I} for INPUT_GRADIENT, {F}
for FORWARD_ONLY), and the memory effect of a dropped kind moves to the kind it needed on
its own stage (W's to I, a backward's to F: a forward with no backward keeps nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple

from pipesched.enums import Role, RunsOn, Stream
from pipesched.errors import PipeschedError
from pipesched.ops import OVERLAP_F_B, B, F, I, O, Op, OpKind, R, W

# messages that cross a stage boundary
ACTIVATION = "activation"  # F(s) -> F(s+1): the hidden state, output_bytes[s]
GRADIENT = "gradient"  # I/B(s+1) -> I/B(s): the gradient of that hidden state, output_bytes[s]
# every transfer kind, messages, the replicas' gradient all-reduce and an all-to-all's pair
# parts, and serving's KV-cache moves (a prompt's cache sent from a prefill to a decode
# instance, a preempted request's cache swapped to host memory and back); a transfer table
# stores a kind as its index here (``timeline.ACTIVATION``, ``GRADIENT``, ``ALLREDUCE``,
# ``ALL_TO_ALL``, ``KV_CACHE``, ``SWAP_OUT``, ``SWAP_IN``), and a model's weights moved to a
# device when a deployment changes shape (``WEIGHT_MOVE``)
TRANSFER_KIND_NAMES = (ACTIVATION, GRADIENT, "allreduce", "all-to-all", "kv-cache", "swap-out", "swap-in", "weights")

# most kinds in one table: a set of kinds is a bit mask in one int64 (complete sets)
MAX_KINDS = 63

# when a memory effect happens
AT_START, AT_END = "start", "end"

# the stream of a device an op runs on: its compute stream, or its host link (offloads)
COMPUTE, HOST_LINK = Stream.COMPUTE, Stream.HOST_LINK
STREAMS = tuple(Stream)

# the cost of an op that moves its stage-microbatch's activation bytes over its device's
# host link (``pipesched.simulate.network.Network.host_bandwidth``; free without a network)
HOST_TRANSFER = "host transfer"

# what a stage does in the backward (see the module docstring); and on which stages a kind runs
TRAINS, INPUT_GRADIENT, FORWARD_ONLY = Role.TRAINS, Role.INPUT_GRADIENT, Role.FORWARD_ONLY
ROLES = tuple(Role)
ALL_STAGES, BACKWARD_STAGES, TRAINED_STAGES = RunsOn.ALL_STAGES, RunsOn.BACKWARD_STAGES, RunsOn.TRAINED_STAGES
_RUNS_IN = MappingProxyType({ALL_STAGES: ROLES, BACKWARD_STAGES: (TRAINS, INPUT_GRADIENT), TRAINED_STAGES: (TRAINS,)})


def stage_roles(num_stages: int, frozen: frozenset[int] | set[int] | tuple[int, ...] = frozenset()) -> tuple[Role, ...]:
    """The role of every stage when the stages ``frozen`` train nothing.

    >>> stage_roles(4, {0, 1, 3})
    ('forward only', 'forward only', 'trains', 'input gradient')
    """
    roles = []
    upstream_trains = False  # some stage before this one trains: its input gradient is needed
    for stage in range(num_stages):
        if stage not in frozen:
            roles.append(TRAINS)
        else:
            roles.append(INPUT_GRADIENT if upstream_trains else FORWARD_ONLY)
        upstream_trains = upstream_trains or stage not in frozen
    return tuple(roles)


class Need(NamedTuple):
    """One input of an op: the op of ``kinds`` (the first the schedule has) on stage
    ``stage + offset`` of the same microbatch; ``message`` names what crosses the boundary
    when that op runs on another device (None: a same-stage input, always local).
    ``step_offset``: the input is the op of step ``step + step_offset`` (-1: the previous
    decode step of the same request); a step before 0 is no need."""

    offset: int
    kinds: tuple[OpKind, ...]
    message: str | None = None
    step_offset: int = 0


class MemoryEffect(NamedTuple):
    """Device bytes = ``whole`` x M_B + ``input_part`` x input_frees x M_B + ``kept`` x K +
    ``per_step`` x step x M_B, at ``at``; host bytes = ``host`` x M_B, at ``host_at`` (an
    offload's copy in host memory). ``per_step`` grows with the op's step index (``Op.step``):
    with M_B one token's KV cache, the op that ends a request at step t frees t tokens'."""

    whole: float = 0.0
    input_part: float = 0.0
    at: str = AT_END
    kept: float = 0.0
    host: float = 0.0
    host_at: str = AT_END
    per_step: float = 0.0

    def bytes(self, activation: float, input_frees: float, kept_for_w: float = 0.0, step: int = 0) -> float:
        return ((self.whole + self.input_part * input_frees + self.per_step * step) * activation
                + self.kept * kept_for_w)

    def amount(self, activation: float, input_share: float, kept_for_w: float = 0.0) -> float:
        """The effect in any unit (a solver's memory grid): ``activation`` the stage-
        microbatch's activations, ``input_share`` what only the input gradient needed
        (input_frees x activation, rounded as the caller rounds it), ``kept_for_w`` the
        gradients I keeps for W."""
        return self.whole * activation + self.input_part * input_share + self.kept * kept_for_w

    def plus(self, other: MemoryEffect) -> MemoryEffect:
        """Both effects as one, at this effect's times."""
        return MemoryEffect(self.whole + other.whole, self.input_part + other.input_part, self.at,
                            self.kept + other.kept, self.host + other.host, self.host_at,
                            self.per_step + other.per_step)


@dataclass(frozen=True)
class KindRule:
    """Everything pipesched knows about one op kind."""

    kind: OpKind  # its letter (an OpKind; a plain one-letter str works for experiments)
    summary: str
    needs: tuple[Need, ...]
    cost: str  # what its duration is per stage: StageCosts.times(cost), or HOST_TRANSFER
    memory: MemoryEffect = MemoryEffect()  # noqa: RUF009 - an immutable NamedTuple
    ends_weight_gradient: bool = False  # after it the stage-microbatch's weight gradient is complete
    stream: Stream = COMPUTE  # the device stream it runs on: COMPUTE or HOST_LINK
    runs_on: RunsOn = ALL_STAGES  # ALL_STAGES, BACKWARD_STAGES or TRAINED_STAGES (see stage_roles)
    cost_without_weights: str | None = None  # its cost on a stage that computes no weight gradient

    # a fused kind: the kinds its parts may have, one tuple per part, in order (empty: a plain kind)
    parts: tuple[tuple[OpKind, ...], ...] = ()

    @property
    def fused(self) -> bool:
        return bool(self.parts)

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise PipeschedError(f"stream={self.stream!r}: choose {' or '.join(STREAMS)}")
        if self.runs_on not in _RUNS_IN:
            raise PipeschedError(f"runs_on={self.runs_on!r}: choose one of {', '.join(_RUNS_IN)}")


@dataclass(frozen=True)
class Rules:
    """A table of op kinds and the sets of kinds a complete stage-microbatch runs."""

    kinds: tuple[KindRule, ...]
    complete: tuple[frozenset[OpKind], ...]
    # groups of kinds a stage-microbatch may add to its complete set, all or none (offload)
    optional: tuple[frozenset[OpKind], ...] = ()
    by_kind: dict[OpKind, KindRule] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_kind", {rule.kind: rule for rule in self.kinds})
        if len(self.by_kind) != len(self.kinds):
            raise PipeschedError("rules: two entries for one op kind")
        if len(self.kinds) > MAX_KINDS:
            raise PipeschedError(f"rules: {len(self.kinds)} op kinds; a table holds at most {MAX_KINDS}")
        known = set(self.by_kind)
        for group in (*self.complete, *self.optional):
            unknown = sorted(str(kind) for kind in group if kind not in known)
            if unknown:
                raise PipeschedError(f"rules: kind={unknown[0]} of a complete or optional set has no entry")

    def __getitem__(self, kind: OpKind) -> KindRule:
        try:
            return self.by_kind[kind]
        except KeyError:
            known = ", ".join(str(rule.kind) for rule in self.kinds)
            raise PipeschedError(f"op kind={kind!s}: not in the rules; known kinds: {known}") from None

    def __iter__(self) -> Iterator[KindRule]:
        return iter(self.kinds)

    def __len__(self) -> int:
        return len(self.kinds)

    def index(self, kind: OpKind) -> int:
        """Position of ``kind`` in the table: the one small integer that stands for a kind in
        arrays (op columns, timelines, colours), whatever the length of its name."""
        found = self._positions.get(kind)
        return self.kinds.index(self[kind]) if found is None else found

    @cached_property
    def _positions(self) -> dict[OpKind, int]:
        return {rule.kind: position for position, rule in enumerate(self.kinds)}

    @cached_property
    def letters(self) -> tuple[str, ...]:
        return tuple(str(rule.kind) for rule in self.kinds)

    @cached_property
    def kinds_by_name(self) -> dict[str, OpKind]:
        """Each kind by the name op text writes it with (``Op.parse``)."""
        return {str(rule.kind): rule.kind for rule in self.kinds}

    @cached_property
    def longest_name(self) -> int:
        """Characters of the longest kind name (of op text's kind part)."""
        return max(len(name) for name in self.kinds_by_name)

    @cached_property
    def fused_kinds(self) -> frozenset[OpKind]:
        """The kinds whose ops are made of parts (never stored as an op row)."""
        return frozenset(rule.kind for rule in self.kinds if rule.fused)

    @cached_property
    def stepped(self) -> bool:
        """Whether some kind reads the step coordinate (``Op.step``): a need on another step,
        or a memory effect that grows per step. Only then are a table's steps read."""
        return any(need.step_offset != 0 for rule in self.kinds for need in rule.needs) or \
            any(rule.memory.per_step != 0 for rule in self.kinds)

    @cached_property
    def max_needs(self) -> int:
        return max((len(rule.needs) for rule in self.kinds), default=0)

    def with_kind(self, rule: KindRule, *, complete: tuple[frozenset[OpKind], ...] | None = None) -> Rules:
        """A new table with ``rule`` added (and other complete sets, when given)."""
        return Rules((*self.kinds, rule), self.complete if complete is None else complete, self.optional)

    # --- what a stage of each role runs (see the module docstring) ----------------------
    def kinds_for(self, role: str) -> frozenset[OpKind]:
        """The kinds a stage of ``role`` runs."""
        return frozenset(rule.kind for rule in self.kinds if role in _RUNS_IN[rule.runs_on])

    def complete_for(self, role: str) -> tuple[frozenset[OpKind], ...]:
        """The complete sets of a stage of ``role``: each complete set less the kinds it drops."""
        kept = self.kinds_for(role)
        return tuple(dict.fromkeys(kinds & kept for kinds in self.complete))

    def accepted_for(self, role: str) -> tuple[frozenset[OpKind], ...]:
        """Every set of kinds a stage-microbatch of ``role`` may run: a complete set, with or
        without each optional group the role runs."""
        kept = self.kinds_for(role)
        accepted = list(self.complete_for(role))
        for group in self.optional:
            if group <= kept:
                accepted += [kinds | group for kinds in accepted]
        return tuple(dict.fromkeys(accepted))

    def cost_for(self, kind: OpKind, role: str) -> str:
        """The cost name of ``kind`` on a stage of ``role``."""
        rule = self[kind]
        if role != TRAINS and rule.cost_without_weights is not None:
            return rule.cost_without_weights
        return rule.cost

    def memory_for(self, kind: OpKind, role: str) -> MemoryEffect:
        """The memory effect of ``kind`` on a stage of ``role``: its own, plus those of the
        kinds the role drops that needed it on their stage (W's folds into I; a dropped
        backward's into F)."""
        return self._memory_by_role[role].get(kind, self[kind].memory)

    @cached_property
    def _memory_by_role(self) -> dict[str, dict[OpKind, MemoryEffect]]:
        found: dict[str, dict[OpKind, MemoryEffect]] = {}
        for role in ROLES:
            kept = self.kinds_for(role)
            effects: dict[OpKind, MemoryEffect] = {}
            sets = [*self.complete, *(kinds | group for kinds in self.complete for group in self.optional)]
            for kinds in sets:
                mine = {kind: self[kind].memory for kind in kinds & kept}
                for dropped in self._ordered(kinds - kept):
                    target = self._fold_target(dropped, kinds & kept)
                    if target is not None:
                        mine[target] = mine[target].plus(self[dropped].memory)
                for kind, effect in mine.items():
                    if effects.setdefault(kind, effect) != effect:
                        raise PipeschedError(f"rules: kind={kind} would free different bytes in two complete sets "
                                             f"of a {role} stage; give each dropped kind one same-stage need")
            found[role] = effects
        return found

    def _fold_target(self, kind: OpKind, present: frozenset[OpKind]) -> OpKind | None:
        """The kind among ``present`` that ``kind`` needed on its own stage, directly or
        through kinds that are not present."""
        for need in self[kind].needs:
            if need.offset != 0:
                continue
            for alternative in need.kinds:
                if alternative in present:
                    return alternative
            for alternative in need.kinds:
                found = self._fold_target(alternative, present)
                if found is not None:
                    return found
        return None

    def sends(self, kind: OpKind) -> tuple[tuple[int, str], ...]:
        """(stage offset of the consumer, message) of each input ``kind`` produces for a
        neighbour stage: F sends its activation to s+1, I and B their gradient to s-1."""
        found = {(-need.offset, need.message): None for rule in self.kinds for need in rule.needs
                 if need.message is not None and kind in need.kinds}
        return tuple(found)

    def units_delta(self, kind: OpKind, role: str = TRAINS) -> float:
        """Change of stage-microbatches in flight an op of ``kind`` makes on a stage of
        ``role`` (M_B = 1, and the input part freed at I counted as still held until W)."""
        if role == TRAINS:
            return self[kind].memory.bytes(1.0, 0.0)
        return self.memory_for(kind, role).bytes(1.0, 0.0)

    def fused_problem(self, op: Op) -> str | None:
        """Why the fused ``op``'s parts do not fit its kind's rule (None when they do)."""
        rule = self[op.kind]
        if not rule.fused:
            return None
        if len(op.parts) != len(rule.parts) or any(part.kind not in kinds
                                                      for part, kinds in zip(op.parts, rule.parts, strict=False)):
            wanted = ";".join("|".join(map(str, kinds)) for kinds in rule.parts)
            return f"its parts must be of kinds ({wanted}) in that order"
        return None

    def describe_complete(self, role: str = TRAINS) -> str:
        """What a complete stage-microbatch of a stage of ``role`` runs: 'one F and either one
        B or one I and one W' (a frozen stage's role names itself)."""
        complete = self.complete_for(role)
        common = frozenset.intersection(*complete)

        def ones(kinds: frozenset[OpKind]) -> str:
            return " and ".join(f"one {kind}" for kind in self._ordered(kinds))

        options = [ones(kinds - common) for kinds in complete if kinds - common]
        text = ones(common)
        if options:
            text += (" and " if text else "") + ("either " + " or ".join(options) if len(options) > 1 else options[0])
        if role != TRAINS:
            text += f" (a frozen stage: {role})"
        return text

    def _ordered(self, kinds: frozenset[OpKind]) -> list[OpKind]:
        return [rule.kind for rule in self.kinds if rule.kind in kinds]


# the backward that produces stage s's input gradient: I when the table splits it, else B
_GRADIENT_SOURCE = Need(+1, (I, B), GRADIENT)
# a backward's own activations: reloaded from host memory when they were offloaded, else F's
_OWN_ACTIVATIONS = Need(0, (R, F))

RULES = Rules(
    kinds=(
        KindRule(F, "forward", needs=(Need(-1, (F,), ACTIVATION),), cost="forward",
                 memory=MemoryEffect(whole=+1.0, at=AT_START)),
        KindRule(I, "backward for inputs", needs=(_OWN_ACTIVATIONS, _GRADIENT_SOURCE), cost="backward_input",
                 memory=MemoryEffect(input_part=-1.0, kept=+1.0, at=AT_END), runs_on=BACKWARD_STAGES),
        KindRule(W, "backward for weights", needs=(Need(0, (I,)),), cost="backward_weight",
                 memory=MemoryEffect(whole=-1.0, input_part=+1.0, kept=-1.0, at=AT_END), ends_weight_gradient=True,
                 runs_on=TRAINED_STAGES),
        KindRule(B, "full backward (I then W)", needs=(_OWN_ACTIVATIONS, _GRADIENT_SOURCE), cost="backward",
                 memory=MemoryEffect(whole=-1.0, at=AT_END), ends_weight_gradient=True, runs_on=BACKWARD_STAGES,
                 cost_without_weights="backward_input"),
        # the device copy is freed once the copy ends; the host copy exists from its start
        KindRule(O, "offload activations to host memory", needs=(Need(0, (F,)),), cost=HOST_TRANSFER,
                 memory=MemoryEffect(whole=-1.0, at=AT_END, host=+1.0, host_at=AT_START), stream=HOST_LINK,
                 runs_on=BACKWARD_STAGES),
        KindRule(R, "reload activations from host memory", needs=(Need(0, (O,)),), cost=HOST_TRANSFER,
                 memory=MemoryEffect(whole=+1.0, at=AT_START, host=-1.0, host_at=AT_END), stream=HOST_LINK,
                 runs_on=BACKWARD_STAGES),
        # fused kinds last (see "Fused kinds" above)
        KindRule(OVERLAP_F_B, "a forward and a backward of one device at once (DualPipe's F&B)", needs=(),
                 cost="forward_backward", parts=((F,), (B, I))),
    ),
    complete=(frozenset({F, B}), frozenset({F, I, W})),
    optional=(frozenset({O, R}),),
)


def held_after_each_op(ops: Sequence[Op], rules: Rules = RULES,
                       roles: Sequence[str] | None = None) -> Iterator[tuple[Op, int]]:
    """(op, stage-microbatches of activations held right after it) along one device's table.

    An F allocates its stage-microbatch's activations; the op that ends its backward frees
    them (B, or W when the backward is split into I and W), an offload moves them to host
    memory and its reload back: the rules' count (``Rules.units_delta``) for the role of
    each op's stage (``roles``, by stage; None: every stage trains). Table order is taken
    as time order on one device. A fused entry is taken part by part (its forward
    allocates when it starts, its backward frees when it ends).
    """
    held = 0.0
    for entry in ops:
        for op in entry.atoms:
            held += rules.units_delta(op.kind) if roles is None else rules.units_delta(op.kind, roles[op.stage])
            yield op, round(held)
