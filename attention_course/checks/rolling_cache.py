"""Checker for exercise 15's rolling-buffer cache: ``rolling_update(buffer, slot_positions,
new, start) -> (kept, kept_positions)``.

The body of :meth:`attention_course.kv.RollingAttentionCache.update` (Mistral's rolling
buffer cache, Jiang et al., 2023), for one tensor (the cache calls it for the keys and for
the values): the buffer ``(B, H, W, Dh)`` is allocated once; position ``p`` is written into
slot ``p % W``, overwriting the position ``W`` older; ``slot_positions (W,)`` records the
position each slot holds (-1: empty), which the sliding-window mask needs. Both are
updated in place. It returns what the buffer holds, oldest first, with the positions.

The expected states come from the package's :class:`~attention_course.kv.RollingAttentionCache`
fed the same updates. The named mistakes: slot ``p`` instead of ``p % W`` (an index past
the buffer), the newest slot overwritten once the buffer is full, a chunk longer than the
window written so that an earlier position overwrites a later one, a shifting buffer
(chronological order, W - 1 copies per step), the buffer returned in slot order, empty
slots returned, the positions not recorded.
"""

from __future__ import annotations

import torch

from attention_course import kv as ref

from ._compare import expect_close, fmt_values
from ._data import randn
from ._runner import TRIVIAL, Case, CaseFailed, call_student, checker
from ._watch import WriteWatch as _WriteWatch

# ---------------------------------------------------------------- known mistakes

ROLL_NO_MODULO = (
    "position p was written to slot p: a buffer of W slots has no slot W; position p goes "
    "to slot p % W, overwriting the position W older"
)
ROLL_NEWEST = (
    "once the buffer is full you overwrite the newest slot (slot W - 1, or the one written "
    "last) instead of the oldest: position p goes to slot p % W, which holds position p - W"
)
ROLL_EARLIER_WINS = (
    "a chunk longer than the window was written so that an earlier position overwrote a "
    "later one in the same slot (p and p + W share slot p % W): only the last W new "
    "positions survive; write them in increasing order, or only those"
)
ROLL_SHIFT = (
    "your buffer shifts (the oldest position always in slot 0, W - 1 entries copied at "
    "every step): a rolling buffer moves nothing; position p is written into slot p % W"
)
ROLL_SLOT_PLUS_ONE = (
    "position p was written to slot (p + 1) % W (off by one): position p goes to slot p % W "
    "(position 0 to slot 0), so that slot p % W always holds the position W older"
)
ROLL_SLOT_ORDER = (
    "you returned the buffer in slot order: after the wrap-around slot 0 holds a newer "
    "position than slot W - 1; return the kept positions oldest first (sort the slots by "
    "the position they hold)"
)
ROLL_EMPTY_SLOTS = (
    "you returned every slot, empty ones included: before the buffer is full only the "
    "filled slots (slot_positions >= 0) hold keys"
)
ROLL_NO_POSITIONS = (
    "slot_positions was not updated: record, in place, the position p written into slot "
    "p % W (`slot_positions[p % W] = p`; the sliding-window mask needs to know which "
    "position each kept key is, and a new tensor does not change the cache's)"
)
ROLL_REPEATED_INDEX = (
    "one indexed write put several positions into the same slot (a chunk longer than W "
    "written at once, `buffer[:, :, pos % W] = new`): with repeated indices PyTorch leaves "
    "undefined which value lands (`index_put_` with accumulate=False; the CPU happens to keep "
    "the last, a GPU need not); write only the chunk's last W positions, or one position at "
    "a time"
)
ROLL_CACHED_PLUS_NEW = (
    "you returned the keys cached before the call followed by the whole chunk (what a "
    "cache hands to the attention of that chunk); this function returns what the buffer "
    "holds after the write: at most W positions, oldest first"
)
ROLL_IGNORES_START = (
    "the slot ignores `start`: position p = start + t (t the index in the chunk) goes to "
    "slot p % W, not t % W"
)
ROLL_POSITION_PLUS_ONE = (
    "slot_positions records p + 1: it holds the position itself, p (0-based), for the "
    "sliding-window mask"
)
ROLL_LAST_ONLY = (
    "only the chunk's last position was written: every new position p (or, for a chunk "
    "longer than W, each of the last W) goes into its slot p % W"
)
ROLL_SAME_ROW = (
    "every position got the same new row: position p's keys are `new[:, :, p - start]`, "
    "the chunk's entry number p - start"
)
ROLL_ROW_MODULO = (
    "you took the new keys at index p % Tn (or p % W): position p's keys are "
    "`new[:, :, p - start]`, its index in the chunk"
)
ROLL_HEADS_FLIPPED = (
    "the heads are in the wrong order: the buffer keeps `new`'s axes, (B, H, W, Dh); write "
    "`buffer[:, :, slot] = new[:, :, t]` with no flip or transpose"
)


def _simulate(W: int, calls: list, variant: str | None = None) -> list[tuple]:
    """The state after each call, done right (None) or with one known mistake:
    (kept, kept_positions, buffer, slot_positions)."""
    B, H, _, Dh = calls[0][1].shape
    buffer = torch.zeros(B, H, W, calls[0][1].shape[-1], dtype=calls[0][1].dtype)
    slots = torch.full((W,), -1, dtype=torch.long)
    states = []
    for start, new in calls:
        positions = list(range(start, start + new.shape[2]))
        if variant == "earlier_wins":
            positions = positions[::-1]
        if variant == "last_only":
            positions = positions[-1:]
        for p in positions:
            t = p - start
            row = {"same_row": 0, "row_modulo": p % new.shape[2]}.get(variant, t)
            if variant == "roll":  # a FIFO from the start: roll left, write the last slot
                buffer = torch.roll(buffer, -1, dims=2)
                slots = torch.roll(slots, -1)
                buffer[:, :, -1] = new[:, :, row]
                slots[-1] = p
                continue
            if variant == "shift" and p >= W:  # drop the oldest, append at the end
                buffer = torch.cat([buffer[:, :, 1:], new[:, :, p - start, None]], dim=2)
                slots = torch.cat([slots[1:], torch.tensor([p])])
                continue
            slot = min(p, W - 1) if variant in ("newest", "shift") else p % W
            if variant == "slot_plus_one":
                slot = (p + 1) % W
            if variant == "ignores_start":
                slot = t % W
            value = new[:, :, row]
            if variant == "heads_flipped":
                value = new[:, :, row].flip(1)
            buffer[:, :, slot] = value
            if variant != "no_positions":
                slots[slot] = p + 1 if variant == "position_plus_one" else p
        if variant == "no_positions":
            record = slots.clone()  # what the student left: all -1
            filled = torch.arange(min(start + new.shape[2], W))
            held = _positions_held(W, start + new.shape[2])
            order = filled[held[filled].argsort()]
            states.append((buffer[:, :, order].clone(), held[order], buffer.clone(), record))
            continue
        filled = (slots >= 0).nonzero().flatten()
        order = filled[slots[filled].argsort()]
        if variant == "slot_order":
            order = filled
        if variant == "empty_slots":
            order = torch.arange(W)
        states.append(
            (buffer[:, :, order].clone(), slots[order].clone(), buffer.clone(), slots.clone())
        )
    return states


def _positions_held(W: int, length: int) -> torch.Tensor:
    """(W,) the position each slot holds after ``length`` positions (-1: empty)."""
    held = torch.full((W,), -1, dtype=torch.long)
    for p in range(max(0, length - W), length):
        held[p % W] = p
    return held


def expected_states(W: int, calls: list) -> list[tuple]:
    """The package's rolling cache fed the same updates: the state after each call."""
    cache = ref.RollingAttentionCache(W)
    B, H, _, Dh = calls[0][1].shape
    states = []
    for _start, new in calls:
        cache.update(new, new)
        held = _positions_held(W, cache.length)
        filled = held >= 0
        buffer = torch.zeros(B, H, W, Dh, dtype=new.dtype)
        buffer[:, :, filled] = cache._keys[:, :, filled]  # slot p % W holds position p
        kept_positions = held[filled].sort().values  # oldest first, as cache.keys
        states.append((cache.keys.clone(), kept_positions, buffer, held))
    return states


VARIANTS = {
    "newest": ROLL_NEWEST,
    "earlier_wins": ROLL_EARLIER_WINS,
    "slot_plus_one": ROLL_SLOT_PLUS_ONE,
    "shift": ROLL_SHIFT,
    "roll": ROLL_SHIFT,
    "slot_order": ROLL_SLOT_ORDER,
    "empty_slots": ROLL_EMPTY_SLOTS,
    "no_positions": ROLL_NO_POSITIONS,
    "ignores_start": ROLL_IGNORES_START,
    "position_plus_one": ROLL_POSITION_PLUS_ONE,
    "last_only": ROLL_LAST_ONLY,
    "same_row": ROLL_SAME_ROW,
    "row_modulo": ROLL_ROW_MODULO,
    "heads_flipped": ROLL_HEADS_FLIPPED,
}


def _same_state(got: tuple, want: tuple) -> bool:
    return all(
        isinstance(g, torch.Tensor) and g.shape == w.shape and torch.equal(g.to(w.dtype), w)
        for g, w in zip(got, want)
    )


def _error_hint(text: str) -> str | None:
    if "out of bounds" in text or "out of range" in text:
        return ROLL_NO_MODULO
    return None


def _as_positions(got, what: str) -> torch.Tensor:
    if isinstance(got, (list, tuple)) and all(isinstance(p, int) for p in got):
        return torch.tensor(got, dtype=torch.long)
    if not isinstance(got, torch.Tensor) or got.is_floating_point() or got.dtype == torch.bool:
        raise CaseFailed(
            f"{what}: expected an integer tensor of positions, got {type(got).__name__}"
            + (f" {got.dtype}" if isinstance(got, torch.Tensor) else "")
        )
    return got.detach().cpu().long()


def _tell_apart(candidate, W: int, B, H, Dh, dtype, found: list[str]) -> list[str]:
    """Of the mistakes in ``found`` (that all gave one state), those that also give every
    state of a run of W + 2 single positions from a fresh buffer; ``found`` if none does
    (or the run fails)."""
    calls = [(p, randn(B, H, 1, Dh, seed=7000 + p, dtype=dtype)) for p in range(W + 2)]
    buffer = torch.zeros(B, H, W, Dh, dtype=dtype)
    slots = torch.full((W,), -1, dtype=torch.long)
    got_states = []
    try:
        for start, new in calls:
            kept, kept_positions = candidate(buffer, slots, new.clone(), start)
            got_states.append(
                (kept.detach().clone(), _as_positions(kept_positions, "kept_positions"))
                + (buffer.clone(), slots.clone())
            )
    except Exception:  # noqa: BLE001 - the probe only sharpens a message
        return found
    left = [
        text
        for name, text in VARIANTS.items()
        if text in found
        and all(_same_state(g, w) for g, w in zip(got_states, _simulate(W, calls, name)))
    ]
    return list(dict.fromkeys(left)) or found


def _sequence_case(candidate, W: int, chunks: list[int], B=1, H=2, Dh=3, dtype=torch.float64):
    """Feed chunks of ``chunks[i]`` new positions one after the other; check every state."""

    def run():
        calls, start = [], 0
        for i, Tn in enumerate(chunks):
            calls.append((start, randn(B, H, Tn, Dh, seed=100 * W + i, dtype=dtype)))
            start += Tn
        want_all = expected_states(W, calls)
        variants = {name: _simulate(W, calls, name) for name in VARIANTS}
        buffer = torch.zeros(B, H, W, Dh, dtype=dtype).as_subclass(_WriteWatch)
        slots = torch.full((W,), -1, dtype=torch.long).as_subclass(_WriteWatch)
        for step, ((start, new), want) in enumerate(zip(calls, want_all)):
            before = buffer.clone()
            _WriteWatch.repeated = []
            what = (
                f"rolling_update(buffer, slot_positions, new, start={start}) with W={W}, "
                f"{new.shape[2]} new position(s) (call {step + 1} of {len(calls)})"
            )
            got = call_student(
                lambda new=new, start=start: candidate(buffer, slots, new.clone(), start),
                what=what,
                error_hint=_error_hint,
            )
            if not isinstance(got, tuple) or len(got) != 2:
                raise CaseFailed(
                    f"{what} returned {type(got).__name__}; expected a tuple (kept, kept_positions)"
                )
            if _WriteWatch.repeated:
                raise CaseFailed(
                    f"{what}: an indexed write repeated the slot(s) "
                    f"{sorted(set(_WriteWatch.repeated[0]))}\nLikely mistake: "
                    f"{ROLL_REPEATED_INDEX}."
                )
            kept, kept_positions = got[0], _as_positions(got[1], f"kept_positions of {what}")
            state = (kept, kept_positions, buffer, slots)
            if isinstance(kept, torch.Tensor) and _same_state(state, want):
                continue
            if bool((kept_positions < 0).any()):
                raise CaseFailed(f"{what}: wrong state\nLikely mistake: {ROLL_EMPTY_SLOTS}.")
            fresh = torch.arange(start, start + new.shape[2])
            if kept_positions.numel() > want[1].numel() and torch.equal(
                kept_positions[-fresh.numel() :], fresh
            ):
                raise CaseFailed(
                    f"{what}: returned {kept_positions.numel()} positions, "
                    f"{fmt_values(kept_positions)}; the buffer holds {want[1].numel()}, "
                    f"{fmt_values(want[1])}\nLikely mistake: {ROLL_CACHED_PLUS_NEW}."
                )
            found = []  # the known mistakes that give exactly this state, each named once
            for name, states in variants.items():
                if isinstance(kept, torch.Tensor) and _same_state(state, states[step]):
                    if VARIANTS[name] not in found:
                        found.append(VARIANTS[name])
            if len(found) > 1:  # a longer run (it wraps) from a fresh buffer tells them apart
                found = _tell_apart(candidate, W, B, H, Dh, dtype, found)
            if len(found) == 1:
                raise CaseFailed(f"{what}: wrong state\nLikely mistake: {found[0]}.")
            if found:
                raise CaseFailed(
                    f"{what}: wrong state\nLikely mistake, one of these (each gives exactly "
                    "this state here; a later call tells them apart):"
                    + "".join(f"\n- {text}." for text in found)
                )
            if not torch.equal(slots, want[3]):
                raise CaseFailed(
                    f"slot_positions after {what}: expected {fmt_values(want[3])}, got "
                    f"{fmt_values(slots)}"
                    + (
                        "\nLikely mistake: " + ROLL_NO_POSITIONS + "."
                        if bool((slots == -1).all())
                        else ""
                    )
                )
            if not torch.equal(buffer, want[2]):
                raise CaseFailed(
                    f"the buffer after {what}: slot s must hold the position slot_positions[s] "
                    f"(p % W == s); the slots that differ: "
                    f"{sorted({int(s) for s in (buffer != want[2]).nonzero()[:, 2]})}"
                    + (
                        "\nHint: write into `buffer` in place (`buffer[:, :, slot] = ...`); a "
                        "new tensor does not change the caller's buffer."
                        if torch.equal(buffer, before)
                        else "\nHint: slot p % W gets position p's keys, "
                        "`new[:, :, p - start]`, all of B, H and Dh unchanged."
                    )
                )
            if not torch.equal(kept_positions, want[1]):
                raise CaseFailed(
                    f"kept_positions of {what}: expected {fmt_values(want[1])} (oldest first), "
                    f"got {fmt_values(kept_positions)}"
                )
            expect_close(kept, want[0], f"kept of {what}", dtype_hint="keep the buffer's dtype")

    return run


@checker("rolling_update")
def check_rolling_update(candidate) -> list[Case]:
    """Check ``rolling_update(buffer, slot_positions, new, start) -> (kept,
    kept_positions)``: position p in slot p % W, in place; the kept positions oldest first."""
    return [
        Case(
            "W = 4, a prompt of 3 positions: the buffer not yet full",
            _sequence_case(candidate, 4, [3]),
            weight=TRIVIAL,
        ),
        Case(
            "W = 4: a prompt of 3, then 5 tokens one at a time (wraps around)",
            _sequence_case(candidate, 4, [3, 1, 1, 1, 1, 1]),
            covers=frozenset({"wrap", "one token"}),
        ),
        Case(
            "W = 4: a prompt of 6 positions, longer than the window",
            _sequence_case(candidate, 4, [6, 1]),
            covers=frozenset({"chunk > W"}),
        ),
        Case(
            "W = 5: chunks of 3, 4 and 1 (the second crosses the wrap)",
            _sequence_case(candidate, 5, [3, 4, 1]),
            covers=frozenset({"wrap", "chunk crosses the wrap"}),
        ),
        Case(
            "W = 1: each position replaces the last",
            _sequence_case(candidate, 1, [1, 1, 2]),
            covers=frozenset({"W=1"}),
        ),
        Case(
            "B = 2, H = 3, float32, W = 3, tokens one at a time",
            _sequence_case(candidate, 3, [1, 1, 1, 1, 1], B=2, H=3, Dh=2, dtype=torch.float32),
            covers=frozenset({"B>1", "dtype=float32", "one token"}),
        ),
    ]
