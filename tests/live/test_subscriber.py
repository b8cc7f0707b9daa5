"""KVEventSubscriber against a real in-process ZMQ publisher and replay ROUTER on 127.0.0.1 (tests/live/zmq_vllm)."""

import pytest
import zmq

from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.subscriber import KVEventSubscriber, subscribe_fleet
from tests.live.zmq_vllm import FakeVllmPublisher

LOOPBACK = Limits(live_hosts="127.0.0.1")  # loopback, any port: the test's own servers


def stored(hashes, parent=None):
    return BlockStored(list(hashes), parent, [0] * 4 * len(hashes), 4, None, "GPU", None)


@pytest.fixture
def publisher():
    pub = FakeVllmPublisher()
    yield pub
    pub.close()


def connect(pub, *, replay=True, timeout_s=1.0):
    sub = KVEventSubscriber(
        check_events_endpoint(pub.endpoint, LOOPBACK),
        replay_endpoint=check_events_endpoint(pub.replay_endpoint, LOOPBACK)
        if replay and pub.replay_endpoint
        else None,
        replay_timeout_s=timeout_s,
    )
    pub.wait_subscribed()
    return sub


def drain(sub, expected_seq):
    for _ in range(50):
        sub.poll(0.1)
        if sub.stats.last_seq == expected_seq:
            return
    raise AssertionError(f"never reached seq {expected_seq}: {sub.stats}")


def hashes(sub):
    return sorted(sub.tree.blocks((0, "GPU")))


def test_in_order_batches_build_the_tree(publisher):
    sub = connect(publisher)
    publisher.publish([stored([1, 2])])
    publisher.publish([stored([3], parent=2)])
    publisher.publish([BlockRemoved([1], "GPU")])
    drain(sub, 2)
    assert hashes(sub) == [2, 3] and sub.stats.applied == 3 and sub.stats.gaps == []
    assert publisher.replay_requests == [0]  # the first poll asked for the history; nothing applied twice
    sub.close()


def test_a_gap_is_replayed_as_vllms_router_expects(publisher):
    sub = connect(publisher)
    publisher.publish([stored([1])])  # seq 0
    drain(sub, 0)
    before = sub.stats.replayed  # seq 0 may have come from the first poll's history request
    publisher.publish([stored([2], parent=1)], send=False)  # seq 1, lost on the way
    publisher.publish([stored([3], parent=2)], send=False)  # seq 2, lost
    publisher.publish([stored([4], parent=3)])  # seq 3 arrives: gap 1..2
    drain(sub, 3)
    assert (
        publisher.replay_requests[-1] == 1
    )  # asked from the first missing seq (after the first poll's history)
    assert sub.stats.gaps == [(1, 2, True)] and sub.stats.replayed - before == 2 and sub.stats.lost == 0
    assert hashes(sub) == [1, 2, 3, 4] and sub.tree.max_depth((0, "GPU")) == 4
    sub.close()


def test_a_gap_without_replay_is_counted_lost(publisher):
    sub = connect(publisher, replay=False)
    publisher.publish([stored([1])])
    publisher.publish([stored([2])], send=False)
    publisher.publish([stored([3])])
    drain(sub, 2)
    assert sub.stats.gaps == [(1, 1, False)] and sub.stats.lost == 1 and hashes(sub) == [1, 3]
    sub.close()


def test_a_late_subscriber_catches_up_from_the_replay_buffer(publisher):
    # batches 0..2 published before anyone listened; the subscriber joins at seq 3 and fetches 0..2
    for h in (1, 2, 3):
        publisher.publish([stored([h])], send=False)
    sub = connect(publisher)
    publisher.publish([BlockRemoved([2], "GPU")])
    drain(sub, 3)
    assert publisher.replay_requests[0] == 0
    assert hashes(sub) == [1, 3] and sub.stats.lost == 0 and sub.stats.applied == 4
    sub.close()


def test_an_idle_server_s_history_arrives_on_the_first_poll(publisher):
    for h in (1, 2):
        publisher.publish([stored([h])], send=False)  # before we subscribed; nothing is published after
    sub = connect(publisher)
    sub.poll(0.0)
    assert publisher.replay_requests == [0] and hashes(sub) == [1, 2] and sub.stats.last_seq == 1
    publisher.publish([stored([3])])  # seq 2 continues the stream
    drain(sub, 2)
    assert hashes(sub) == [1, 2, 3] and sub.stats.gaps == [] and sub.stats.duplicates == 0
    sub.close()


def test_a_restarted_publisher_clears_the_tree(publisher):
    sub = connect(publisher)
    publisher.publish([stored([1])])
    publisher.publish([stored([2])])
    drain(sub, 1)
    publisher.buffer.clear()
    publisher.publish([stored([9])], seq=0)  # a new server process counts from 0 again
    drain(sub, 0)
    assert sub.stats.restarts == 1 and hashes(sub) == [9]
    sub.close()


def test_malformed_messages_are_counted_and_skipped(publisher):
    sub = connect(publisher, replay=False)
    publisher.pub.send_multipart([b"kv-events", b"\x00" * 8])  # two frames
    publisher.publish([stored([1])], seq=0)
    publisher.pub.send_multipart([b"kv-events", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    publisher.publish([AllBlocksCleared()], seq=2)
    publisher.publish([stored([5])], seq=3)
    drain(sub, 3)
    assert sub.stats.bad_messages == 2 and "not msgpack" in sub.stats.last_error
    assert hashes(sub) == [5] and sub.stats.lost == 0
    sub.close()


def test_a_silent_replay_endpoint_times_out_and_counts_the_loss():
    pub = FakeVllmPublisher(replay=False)
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # bound, never answers
    silent.bind("tcp://127.0.0.1:*")
    try:
        sub = KVEventSubscriber(
            check_events_endpoint(pub.endpoint, LOOPBACK),
            replay_endpoint=check_events_endpoint(silent.getsockopt(zmq.LAST_ENDPOINT).decode(), LOOPBACK),
            replay_timeout_s=0.3,
        )
        pub.wait_subscribed()
        pub.publish([stored([1])])
        drain(sub, 0)
        pub.publish([stored([2])], send=False)
        pub.publish([stored([3])])
        drain(sub, 2)
        assert sub.stats.lost == 1 and "did not finish" in sub.stats.last_error
        sub.close()
    finally:
        silent.close(0)
        pub.close()


def test_fleet_subscribes_rank_r_on_port_plus_r():
    pubs = []
    try:
        # find two consecutive free ports by binding rank 0 then rank 1 at port + 1
        ctx = zmq.Context.instance()
        for _ in range(20):
            first = FakeVllmPublisher(replay=False)
            port = int(first.endpoint.rsplit(":", 1)[1])
            second = FakeVllmPublisher(replay=False)
            second.pub.unbind(second.endpoint)
            try:
                second.pub.bind(f"tcp://127.0.0.1:{port + 1}")
            except zmq.ZMQError:
                first.close()
                second.close()
                continue
            pubs = [first, second]
            break
        assert pubs, "no two consecutive free ports"
        subs = subscribe_fleet(check_events_endpoint(pubs[0].endpoint, LOOPBACK), 2, LOOPBACK, context=ctx)
        for p in pubs:
            p.wait_subscribed()
        pubs[0].publish([stored([1, 2])])
        pubs[1].publish([stored([7])])
        drain(subs[0], 0)
        drain(subs[1], 0)
        assert [s.tree.num_blocks() for s in subs] == [2, 1]
        assert subs[1].endpoint.port == port + 1
        for s in subs:
            s.close()
    finally:
        for p in pubs:
            p.close()


def test_fleet_addresses_are_checked_before_any_socket_opens():
    only_base = Limits(live_hosts="127.0.0.1:5557")
    base = check_events_endpoint("tcp://127.0.0.1:5557", only_base)
    with pytest.raises(Exception, match="PAGED_LAB_LIVE_HOSTS"):
        subscribe_fleet(base, 2, only_base)
