"""Buggy rolling-buffer updates (exercise 15, ``rolling_update(buffer, slot_positions, new,
start) -> (kept, kept_positions)``)."""

import torch


def reference_rolling_update(buffer, slot_positions, new, start):
    """Right: position p into slot p % W (only the last W new ones), kept oldest first."""
    W, Tn = buffer.shape[2], new.shape[2]
    for p in range(max(start, start + Tn - W), start + Tn):
        buffer[:, :, p % W] = new[:, :, p - start]
        slot_positions[p % W] = p
    filled = (slot_positions >= 0).nonzero().flatten()
    order = filled[slot_positions[filled].argsort()]  # oldest first
    return buffer[:, :, order], slot_positions[order]


def _read(buffer, slot_positions):
    filled = (slot_positions >= 0).nonzero().flatten()
    order = filled[slot_positions[filled].argsort()]
    return buffer[:, :, order], slot_positions[order]


def rolling_update_no_modulo(buffer, slot_positions, new, start):
    """Slot p instead of p % W: an index past the buffer once p >= W."""
    for p in range(start, start + new.shape[2]):
        buffer[:, :, p] = new[:, :, p - start]
        slot_positions[p] = p
    return _read(buffer, slot_positions)


def rolling_update_overwrites_newest(buffer, slot_positions, new, start):
    """Appends until full, then keeps overwriting the last slot (the newest)."""
    W = buffer.shape[2]
    for p in range(start, start + new.shape[2]):
        slot = min(p, W - 1)
        buffer[:, :, slot] = new[:, :, p - start]
        slot_positions[slot] = p
    return _read(buffer, slot_positions)


def rolling_update_slot_order(buffer, slot_positions, new, start):
    """Right writes, but returns the filled slots in slot order (out of order after a wrap)."""
    W = buffer.shape[2]
    for p in range(start, start + new.shape[2]):
        buffer[:, :, p % W] = new[:, :, p - start]
        slot_positions[p % W] = p
    filled = (slot_positions >= 0).nonzero().flatten()
    return buffer[:, :, filled], slot_positions[filled]


def rolling_update_earlier_wins(buffer, slot_positions, new, start):
    """Writes the chunk from its last position to its first: p overwrites p + W."""
    W = buffer.shape[2]
    for p in reversed(range(start, start + new.shape[2])):
        buffer[:, :, p % W] = new[:, :, p - start]
        slot_positions[p % W] = p
    return _read(buffer, slot_positions)


def rolling_update_shift(buffer, slot_positions, new, start):
    """A shifting window: when full, every entry moves one slot left (W - 1 copies)."""
    W = buffer.shape[2]
    for p in range(start, start + new.shape[2]):
        if p >= W:
            buffer[:, :, :-1] = buffer[:, :, 1:].clone()
            slot_positions[:-1] = slot_positions[1:].clone()
        slot = min(p, W - 1)
        buffer[:, :, slot] = new[:, :, p - start]
        slot_positions[slot] = p
    return _read(buffer, slot_positions)


def rolling_update_all_slots(buffer, slot_positions, new, start):
    """Returns every slot, the empty ones too, before the buffer is full."""
    reference_rolling_update(buffer, slot_positions, new, start)
    order = slot_positions.argsort()
    return buffer[:, :, order], slot_positions[order]


def rolling_update_repeated_index(buffer, slot_positions, new, start):
    """One indexed write of the whole chunk: with Tn > W the slot index repeats (undefined in
    PyTorch; the CPU happens to keep the last write)."""
    W, Tn = buffer.shape[2], new.shape[2]
    pos = torch.arange(start, start + Tn)
    buffer[:, :, pos % W] = new
    slot_positions[pos % W] = pos
    return _read(buffer, slot_positions)


def _loop(buffer, slot_positions, new, start, *, slot=None, row=None, value=None, record=None):
    W, Tn = buffer.shape[2], new.shape[2]
    for t in range(Tn):
        p = start + t
        s = slot(p, t, W) if slot else p % W
        r = row(p, t, Tn) if row else t
        buffer[:, :, s] = value(new[:, :, r]) if value else new[:, :, r]
        slot_positions[s] = record(p) if record else p
    return _read(buffer, slot_positions)


def rolling_update_ignores_start(buffer, slot_positions, new, start):
    """Slot t % W, t the index in the chunk: ``start`` forgotten."""
    return _loop(buffer, slot_positions, new, start, slot=lambda p, t, W: t % W)


def rolling_update_records_p_plus_one(buffer, slot_positions, new, start):
    """slot_positions holds p + 1 (1-based positions)."""
    return _loop(buffer, slot_positions, new, start, record=lambda p: p + 1)


def rolling_update_first_row(buffer, slot_positions, new, start):
    """Writes ``new[:, :, 0]`` for every position of the chunk."""
    return _loop(buffer, slot_positions, new, start, row=lambda p, t, Tn: 0)


def rolling_update_row_p_mod_tn(buffer, slot_positions, new, start):
    """Takes the new keys at index p % Tn instead of p - start."""
    return _loop(buffer, slot_positions, new, start, row=lambda p, t, Tn: p % Tn)


def rolling_update_heads_flipped(buffer, slot_positions, new, start):
    """Writes the heads in reverse order."""
    return _loop(buffer, slot_positions, new, start, value=lambda x: x.flip(1))


def rolling_update_last_only(buffer, slot_positions, new, start):
    """Writes only the chunk's last position."""
    W, Tn = buffer.shape[2], new.shape[2]
    p = start + Tn - 1
    buffer[:, :, p % W] = new[:, :, -1]
    slot_positions[p % W] = p
    return _read(buffer, slot_positions)


def rolling_update_fifo_roll(buffer, slot_positions, new, start):
    """A FIFO from the first call: roll everything left, write the last slot."""
    for t in range(new.shape[2]):
        buffer.copy_(torch.roll(buffer, -1, dims=2))
        buffer[:, :, -1] = new[:, :, t]
        slot_positions.copy_(torch.roll(slot_positions, -1))
        slot_positions[-1] = start + t
    return _read(buffer, slot_positions)


def rolling_update_cached_plus_new(buffer, slot_positions, new, start):
    """Returns the last W - 1 cached keys followed by the whole chunk (keys for attention),
    not what the buffer holds."""
    W = buffer.shape[2]
    old_k, old_p = _read(buffer, slot_positions)
    keep = W - 1
    old_k = old_k[:, :, max(0, old_k.shape[2] - keep) :].clone() if keep else old_k[:, :, :0]
    old_p = old_p[max(0, old_p.shape[0] - keep) :].clone() if keep else old_p[:0]
    reference_rolling_update(buffer, slot_positions, new, start)
    positions = torch.arange(start, start + new.shape[2])
    return torch.cat([old_k, new], dim=2), torch.cat([old_p, positions])


CATALOGUE = [
    ("rolling_update", "slot p, no modulo", rolling_update_no_modulo, "slot p % W"),
    ("rolling_update", "overwrites the newest", rolling_update_overwrites_newest, "newest slot"),
    ("rolling_update", "slot order", rolling_update_slot_order, "slot order"),
    ("rolling_update", "earlier overwrites later", rolling_update_earlier_wins, "earlier position"),
    ("rolling_update", "shifting buffer", rolling_update_shift, "your buffer shifts"),
    ("rolling_update", "empty slots returned", rolling_update_all_slots, "empty ones included"),
    ("rolling_update", "repeated slot index", rolling_update_repeated_index, "repeated the slot"),
    ("rolling_update", "start ignored", rolling_update_ignores_start, "ignores `start`"),
    ("rolling_update", "p + 1 recorded", rolling_update_records_p_plus_one, "records p + 1"),
    ("rolling_update", "new[:, :, 0] always", rolling_update_first_row, "the same new row"),
    ("rolling_update", "new at p % Tn", rolling_update_row_p_mod_tn, "index p % Tn"),
    ("rolling_update", "heads flipped", rolling_update_heads_flipped, "heads are in the wrong"),
    ("rolling_update", "last position only", rolling_update_last_only, "only the chunk's last"),
    ("rolling_update", "FIFO roll from the start", rolling_update_fifo_roll, "your buffer shifts"),
    (
        "rolling_update",
        "cached + new returned",
        rolling_update_cached_plus_new,
        "cached before the call followed by the whole chunk",
    ),
]


# Round 5 (a fresh student, set 15): tests/test_verdicts_round5.py runs it.


def rolling_update_slot_plus_one(buffer, slot_positions, new, start):
    """Position p into slot (p + 1) % W: off by one, told that the buffer shifts."""
    W = buffer.shape[2]
    for p in range(start, start + new.shape[2]):
        buffer[:, :, (p + 1) % W] = new[:, :, p - start]
        slot_positions[(p + 1) % W] = p
    return _read(buffer, slot_positions)


def rolling_update_rolls(buffer, slot_positions, new, start):
    """A FIFO from the first position: roll everything one slot left, write the last slot.
    Before the wrap its state equals the slot (p + 1) % W mistake's."""
    for p in range(start, start + new.shape[2]):
        buffer.copy_(torch.roll(buffer, -1, dims=2))
        slot_positions.copy_(torch.roll(slot_positions, -1))
        buffer[:, :, -1] = new[:, :, p - start]
        slot_positions[-1] = p
    return _read(buffer, slot_positions)
