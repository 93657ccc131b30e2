"""The service's queue as a policy: plain slots in, grants out. No SQLite, no processes, no threads, no clock."""

from scheduler.core.states import SlotState
from scheduler.service.queue import Queue
from scheduler.service.store import Slot

LIMIT = 36_000
NOW = 1_000_000.0


def slot(sid, mib, minutes=30.0, priority=0, created=NOW, cpus=1):
    return Slot(slot_id=sid, owner="a", state="queued", gpu_memory_mib=mib, cpus=cpus, minutes=minutes,
                priority=priority, label="", client_request_id=None, created=created, heartbeat_s=60.0)


def queue(gpus=1, cpus=16):
    slots = {}
    return Queue({f"local:{i}": LIMIT for i in range(gpus)}, {"local": cpus}, slots), slots


def arrive(q, slots, *new):
    for s in new:
        slots[s.slot_id] = s
        q.arrive(s)


def test_what_fits_is_granted_and_held_in_the_ledger():
    q, slots = queue()
    arrive(q, slots, slot("a", 20_000))
    granted = q.schedule(NOW, {})
    assert [(s.slot_id, dev) for s, dev in granted] == [("a", "local:0")]
    a = slots["a"]
    assert a.state == SlotState.GRANTED and a.deadline == NOW + 30 * 60
    assert q.used == {"local:0": 20_000} and q.order == []
    assert q.free({}) == ({"local:0": LIMIT - 20_000}, {"local": 15})


def test_the_head_waits_and_others_use_leave_less_room():
    q, slots = queue()
    arrive(q, slots, slot("a", 20_000))
    q.schedule(NOW, {})
    arrive(q, slots, slot("b", 20_000, created=NOW + 1))
    assert q.schedule(NOW + 1, {}) == []
    assert slots["b"].state == SlotState.QUEUED and q.position(slots["b"]) == 0
    q2, slots2 = queue()
    arrive(q2, slots2, slot("c", 20_000))
    assert q2.schedule(NOW, {"local:0": 20_000}) == []  # a plan run holds the room


def test_priority_orders_the_queue_and_aging_lets_the_old_catch_up():
    q, slots = queue()
    old = slot("old", 1, created=NOW)
    new = slot("new", 1, priority=1, created=NOW + 10)
    arrive(q, slots, old, new)
    assert [sid for _, sid in q.order] == ["new", "old"]
    q2, slots2 = queue()
    arrive(q2, slots2, slot("old", 1, created=NOW), slot("new", 1, priority=1, created=NOW + 400))
    assert [sid for _, sid in q2.order] == ["old", "new"]  # 400 s of waiting is worth more than one point


def test_backfill_takes_a_short_request_that_ends_before_the_head_could_start():
    q, slots = queue()
    arrive(q, slots, slot("running", 30_000, minutes=60))
    q.schedule(NOW, {})
    head = slot("head", 20_000, created=NOW + 1)
    short = slot("short", 4_000, minutes=10, created=NOW + 2)
    long = slot("long", 4_000, minutes=120, created=NOW + 3)
    arrive(q, slots, head, short, long)
    granted = [s.slot_id for s, _ in q.schedule(NOW + 5, {})]
    assert granted == ["short"]  # the long one would still hold its room when the head could start
    assert head.state == long.state == SlotState.QUEUED


def test_releasing_a_lease_lets_the_head_start():
    q, slots = queue()
    arrive(q, slots, slot("a", 30_000))
    q.schedule(NOW, {})
    arrive(q, slots, slot("b", 30_000, created=NOW + 1))
    assert q.schedule(NOW + 1, {}) == []
    a = slots.pop("a")
    q.remove(a)
    assert [s.slot_id for s, _ in q.schedule(NOW + 2, {})] == ["b"]


def test_deciding_only_the_newcomer_never_starts_another():
    q, slots = queue()
    arrive(q, slots, slot("big", 30_000))
    q.schedule(NOW, {})
    arrive(q, slots, slot("head", 30_000, created=NOW + 1))
    q.schedule(NOW + 1, {})
    small = slot("small", 1_000, minutes=5, created=NOW + 2)
    arrive(q, slots, small)
    assert [s.slot_id for s, _ in q.schedule(NOW + 2, {}, only=small)] == ["small"]
    assert slots["head"].state == SlotState.QUEUED


def test_estimated_starts_follow_the_leases_ends():
    q, slots = queue()
    arrive(q, slots, slot("a", 30_000, minutes=10))
    q.schedule(NOW, {})
    b = slot("b", 30_000, created=NOW + 1)
    arrive(q, slots, b)
    q.schedule(NOW + 1, {})
    q.refresh_estimates(NOW + 1, {})
    key = q.estimates_key({})
    assert q.estimate_of(b, q.position(b), key) == NOW + 10 * 60
