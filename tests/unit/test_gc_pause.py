"""gc_pause.frozen_heap: objects made before the block are frozen inside it and handed back after."""

from __future__ import annotations

import gc

import pytest

from tracelens.gc_pause import frozen_heap


def test_frozen_inside_and_handed_back():
    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == 0


def test_handed_back_on_error():
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_cycles_made_before_are_collected_after():
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = [0]

    import weakref

    weakref.finalize(a, lambda: alive.__setitem__(0, 1))
    del a, b
    with frozen_heap():
        gc.collect()
        assert alive[0] == 0  # (frozen: not looked at)
    gc.collect()
    assert alive[0] == 1


def test_refreeze_inside_is_handed_back_too():
    from tracelens.gc_pause import refreeze

    with frozen_heap():
        n = gc.get_freeze_count()
        made = [[i] for i in range(1000)]  # (tracked objects made inside the block)
        refreeze()
        assert gc.get_freeze_count() >= n + len(made)
    assert gc.get_freeze_count() == 0
