"""SubmissionSequencer: tickets in issue order, turn-taking across threads, timeout and abort."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace
import time

import pytest

from swpipe_core.engine.sequencer import SequencerAborted, SequencerTimeout, SubmissionSequencer

pytestmark = pytest.mark.timeout(30)


def test_tickets_are_issued_in_call_order():
    seq = SubmissionSequencer()
    assert [seq.ticket(f"t{k}") for k in range(5)] == [0, 1, 2, 3, 4]


def test_threads_execute_in_sequence_order_whatever_their_arrival():
    seq = SubmissionSequencer(timeout=10)
    tickets = [seq.ticket(k) for k in range(40)]
    order = []
    rng = random.Random(3)
    shuffled = tickets[:]
    rng.shuffle(shuffled)
    # 4 threads, each owning a shuffled slice, call in sorted order within their slice (like FIFO queues)
    slices = [sorted(shuffled[k::4]) for k in range(4)]

    def worker(mine):
        for s in mine:
            seq.execute_ordered(s, lambda s=s: order.append(s))

    threads = [threading.Thread(target=worker, args=(m,), name=f"seq-test-{k}") for k, m in enumerate(slices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == tickets
    assert seq.next_seq == 40


def test_timeout_names_waiting_task_and_the_turn_it_waits_for():
    seq = SubmissionSequencer(timeout=0.05)
    seq.ticket("DistStart (iteration 4)")
    mine = seq.ticket("AllReduce (iteration 2)")
    with pytest.raises(SequencerTimeout) as info:
        seq.execute_ordered(mine, lambda: None)
    got = info.value
    assert (got.task, got.sequence, got.waiting_for, got.next_sequence, got.timeout_s) == (
        "AllReduce (iteration 2)", 1, "DistStart (iteration 4)", 0, 0.05)
    assert isinstance(got, RuntimeError) and not isinstance(got, SequencerAborted)


def test_abort_wakes_every_waiter(monkeypatch):
    import swpipe_core.engine.sequencer as sequencer

    errors = []

    def wait(s):
        try:
            seq.execute_ordered(s, lambda: None)
        except SequencerAborted:
            errors.append(s)

    blocked, arrived = set(), threading.Condition()

    class Counted(threading.Condition):
        """The sequencer's condition, naming its waiters: a waiter named holds the lock until it waits."""

        def wait(self, timeout=None):
            with arrived:
                blocked.add(threading.current_thread().name)
                arrived.notify_all()
            return super().wait(timeout)

    # the sequencer's condition, the one place a waiter blocks, observed here
    monkeypatch.setattr(sequencer, "threading", SimpleNamespace(Condition=Counted, Lock=threading.Lock))
    seq = SubmissionSequencer(timeout=3600)  # longer than the test: only the abort can end the waits
    threads = [threading.Thread(target=wait, args=(s,), name=f"seq-wait-{s}", daemon=True) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    with arrived:  # every waiter is blocked in the sequencer before the abort (ordered, not slept for)
        assert arrived.wait_for(lambda: len(blocked) == 3, timeout=20.0), blocked
    seq.abort("X-failed")
    for t in threads:
        t.join(5)
    assert not [t.name for t in threads if t.is_alive()]  # every waiter woke and returned
    assert sorted(errors) == [1, 2, 3]
    with pytest.raises(SequencerAborted) as info:
        seq.execute_ordered(0, lambda: None)
    assert (info.value.sequence, info.value.reason, info.value.failed_sequence) == (0, "X-failed", None)


def test_failing_fn_aborts_so_later_tickets_do_not_hang():
    seq = SubmissionSequencer(timeout=3600)  # longer than the test: a later ticket must not wait for it

    def bad():
        raise ValueError("collective failed")

    with pytest.raises(ValueError):
        seq.execute_ordered(0, bad)
    with pytest.raises(SequencerAborted) as info:
        seq.execute_ordered(1, lambda: None)
    assert (info.value.sequence, info.value.failed_sequence) == (1, 0) and "ValueError" in info.value.reason


def test_reset_restarts_at_zero_and_clears_abort():
    seq = SubmissionSequencer()
    seq.ticket(); seq.ticket()
    seq.execute_ordered(0, lambda: None)
    seq.abort()
    seq.reset()
    assert seq.aborted is None and seq.next_seq == 0 and seq.ticket() == 0
    assert seq.execute_ordered(0, lambda: "ok") == "ok"


def test_same_sequence_on_every_rank_for_the_same_enqueue_order():
    """Two 'ranks' with different thread timing produce the same execution order."""
    def rank(seed):
        seq = SubmissionSequencer(timeout=10)
        labels = [f"{n}{i}" for i in range(10) for n in ("A", "B")]
        tickets = {lab: seq.ticket(lab) for lab in labels}
        out = []
        rng = random.Random(seed)

        def worker(prefix):
            for lab in labels:
                if lab.startswith(prefix):
                    time.sleep(rng.random() * 1e-3)  # workload jitter, differs per rank
                    seq.execute_ordered(tickets[lab], lambda lab=lab: out.append(lab))

        ts = [threading.Thread(target=worker, args=(p,), name=f"rank{seed}-{p}") for p in "AB"]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        return out

    assert rank(1) == rank(2) == [f"{n}{i}" for i in range(10) for n in ("A", "B")]
