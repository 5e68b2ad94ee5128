"""Buggy rolling-buffer updates (exercise 15, ``rolling_update(buffer, slot_positions, new,
start) -> (kept, kept_positions)``)."""


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


CATALOGUE = [
    ("rolling_update", "slot p, no modulo", rolling_update_no_modulo, "slot p % W"),
    ("rolling_update", "overwrites the newest", rolling_update_overwrites_newest, "newest slot"),
    ("rolling_update", "slot order", rolling_update_slot_order, "slot order"),
    ("rolling_update", "earlier overwrites later", rolling_update_earlier_wins, "earlier position"),
    ("rolling_update", "shifting buffer", rolling_update_shift, "your buffer shifts"),
    ("rolling_update", "empty slots returned", rolling_update_all_slots, "empty ones included"),
]
