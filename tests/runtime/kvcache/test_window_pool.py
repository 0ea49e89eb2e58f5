"""The window layers' own slots (runtime/kvcache/window_pool.py): a full slot is handed out and freed
with its window slot, a released window slot leaves its full slot, and a prefix is reusable only as
far as the window KV its next token sees is still there."""

from __future__ import annotations

from runtime.kvcache.pool import KVPool
from runtime.kvcache.window_pool import TiedSlotAllocator, WindowSlots


def tied(full: int = 32, window_slots: int = 8, window: int = 4) -> TiedSlotAllocator:
    return TiedSlotAllocator(full, WindowSlots(full, window_slots, window))


def test_full_and_window_slots_are_taken_and_freed_together():
    a = tied()
    assert a.room == 8
    s = a.alloc(6)
    assert a.num_free == 26 and a.room == 2 and a.window.present(s).all()
    assert a.alloc(3) is None  # the window pool is short, not the full one
    a.window.check_invariant(a)
    assert a.window.release(s[:4]) == 4 and a.room == 6
    assert a.window.release(s[:4]) == 0  # released once only
    a.free(s)  # frees the 2 window slots left with their full slots
    assert (a.num_free, a.room) == (32, 8)
    a.window.check_invariant(a)


def test_a_released_position_reads_the_scratch_row():
    a = tied()
    s = a.alloc(3)
    a.window.release(s[1:2])
    assert a.window.translate(s)[1] == a.window.none == 8


def test_exact_length_keeps_the_window_its_next_token_sees():
    a = tied(window_slots=32, window=4)
    s = a.alloc(20)
    w = a.window
    assert w.exact_length(s, 20) == 20
    w.release(s[:10])  # positions 0..9 gone: position 13 sees 10, 11, 12 (and itself)
    assert w.exact_length(s, 20) == 20 and w.exact_length(s, 13) == 13
    assert w.exact_length(s, 12) == 0  # it would see 9
    w.release(s[15:16])  # a hole: the longest prefix whose last 3 positions are all there
    assert w.exact_length(s, 20) == 20 and w.exact_length(s, 19) == 19
    assert w.exact_length(s, 18) == 15 and w.exact_length(s, 16) == 15
    assert w.exact_length(s, 18, page_size=4) == 0  # 13 and 15 are not whole pages; 12 would see 9
    assert w.exact_length(s, 2) == 0 and w.exact_length(s, 0) == 0


def test_the_window_layers_hold_only_the_window_slots():
    kv = KVPool(3, 1000, 2, 8, layer_windows=(16, 0, 16), window_slots=100)
    b = kv.kv_bytes()
    assert b["full"] == 2 * 1001 * 2 * 8 * 4 and b["window"] == 2 * 2 * 101 * 2 * 8 * 4
    assert kv.k[0].shape[0] == 101 and kv.k[1].shape[0] == 1001 and isinstance(kv.allocator, TiedSlotAllocator)
    plain = KVPool(3, 1000, 2, 8, layer_windows=(16, 0, 16))  # no window slots: every layer keeps all
    assert plain.window is None and plain.kv_bytes()["window"] == 0
