"""Events both ways, as vLLM sends them (its rule: bind the PUB socket for a wildcard endpoint, connect it to any
other): a binding KVEventSubscriber hears a publisher that connects (core.serve's own ZmqEventPublisher and a
bare pyzmq PUB socket), a connecting one hears a publisher that binds, and a subscriber whose PUB socket stays
silent while the replay answers says so (and keeps its tree from the replay)."""

import json
import threading
import time

import pytest
import zmq

from core.errors import InvalidArgumentError, LiveEndpointError
from core.kv.events import BlockStored, encode_event_batch
from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.subscriber import KVEventSubscriber
from core.live.watch import LiveWatch, Sources
from core.serve.kv_publisher import ZmqEventPublisher
from core.serve.launcher import free_port
from core.serve.server import is_bind_endpoint, parse_kv_events_config
from tests.live.zmq_vllm import FakeVllmPublisher

LOOPBACK = Limits(live_hosts="127.0.0.1")


def stored(hashes, parent=None):
    return BlockStored(list(hashes), parent, list(range(4 * len(hashes))), 4, None, "GPU", None)


def wait_for(sub, blocks, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sub.poll(0.1)
        if len(sub.tree.blocks((0, "GPU"))) >= blocks:
            return
    raise AssertionError(f"only {sub.tree.counts()} after {timeout_s} s: {sub.stats}")


def test_binding_subscriber_hears_core_serves_connecting_publisher():
    """core.serve's publisher given a named host connects (vLLM's rule), so the subscriber binds there."""
    port = free_port()
    sub = KVEventSubscriber(check_events_endpoint(f"tcp://127.0.0.1:{port}", LOOPBACK), bind=True)
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{port}", topic="kv-events", bind=False)
    try:
        assert not pub.binds and pub.endpoint == f"tcp://127.0.0.1:{port}"
        deadline = (
            time.monotonic() + 10
        )  # ZMQ's slow joiner: publish until the subscription has reached the PUB
        while not sub.tree.blocks((0, "GPU")) and time.monotonic() < deadline:
            pub.publish([stored([11, 12])])
            sub.poll(0.2)
        pub.publish([stored([13], parent=12)])
        wait_for(sub, 3)
        assert sorted(sub.tree.blocks((0, "GPU"))) == [11, 12, 13] and sub.stats.bad_messages == 0
    finally:
        pub.close()
        sub.close()


def test_binding_subscriber_hears_a_bare_pyzmq_pub_that_connects():
    """A PUB socket that connects, framed as vLLM frames its batches; the first batches are sent again until one
    arrives (a PUB drops what it sends before the subscription reaches it), as new sequence numbers."""
    port = free_port()
    sub = KVEventSubscriber(check_events_endpoint(f"tcp://127.0.0.1:{port}", LOOPBACK), bind=True)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        pub.connect(f"tcp://127.0.0.1:{port}")
        seq, deadline = 0, time.monotonic() + 10
        while not sub.tree.blocks((0, "GPU")) and time.monotonic() < deadline:
            pub.send_multipart(
                [b"kv-events", seq.to_bytes(8, "big"), encode_event_batch([stored([1, 2])], 0.0)]
            )
            seq += 1
            sub.poll(0.2)
        pub.send_multipart(
            [b"kv-events", seq.to_bytes(8, "big"), encode_event_batch([stored([3], parent=2)], 0.0)]
        )
        wait_for(sub, 3)
        assert sorted(sub.tree.blocks((0, "GPU"))) == [1, 2, 3] and sub.stats.last_seq == seq
    finally:
        pub.close(0)
        ctx.term()
        sub.close()


def test_connecting_subscriber_hears_core_serves_binding_publisher():
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv-events")
    sub = KVEventSubscriber(
        check_events_endpoint(pub.endpoint, LOOPBACK),
        replay_endpoint=check_events_endpoint(pub.replay_endpoint, LOOPBACK),
    )
    try:
        assert pub.binds
        pub.publish([stored([7, 8])])
        wait_for(sub, 2)  # from the replay at once, or the PUB socket
        assert not sub.pub_silent
    finally:
        pub.close()
        sub.close()


def test_bind_is_loopback_only_and_a_taken_port_is_a_typed_error():
    anywhere = Limits(live_hosts="10.0.0.0/8")
    with pytest.raises(InvalidArgumentError, match="loopback"):
        KVEventSubscriber(check_events_endpoint("tcp://10.1.2.3:5557", anywhere), bind=True)
    first = KVEventSubscriber(check_events_endpoint(f"tcp://127.0.0.1:{free_port()}", LOOPBACK), bind=True)
    try:
        with pytest.raises(LiveEndpointError, match="listen for KV events"):
            KVEventSubscriber(first.endpoint, bind=True)
    finally:
        first.close()


def test_a_binding_subscriber_waits_for_an_address_released_a_moment_later():
    """The last page run's (or test's) subscriber releases its listening socket in ZeroMQ's I/O thread a moment
    after close: a new binding subscriber waits for it (up to BIND_WAIT_S) instead of failing at once."""
    endpoint = check_events_endpoint(f"tcp://127.0.0.1:{free_port()}", LOOPBACK)
    holder = zmq.Context.instance().socket(zmq.SUB)
    holder.bind(endpoint.address)
    release = threading.Timer(0.3, holder.close, kwargs={"linger": 0})
    release.start()
    started = time.monotonic()
    try:
        sub = KVEventSubscriber(endpoint, bind=True)
        sub.close()
    finally:
        release.join()
    assert 0.25 <= time.monotonic() - started < KVEventSubscriber.BIND_WAIT_S


def test_a_silent_pub_socket_is_reported_and_the_replay_keeps_the_tree():
    """A subscriber that connects where nothing publishes (the vLLM connects its PUB too) hears nothing on the
    PUB socket; the replay, which vLLM always binds, holds the batches: the subscriber says so and applies them."""
    publisher = FakeVllmPublisher()
    try:
        watch = LiveWatch()
        sources = Sources(
            events=check_events_endpoint(publisher.endpoint, LOOPBACK),
            replay=check_events_endpoint(publisher.replay_endpoint, LOOPBACK),
        )
        watch.configure(sources, LOOPBACK)
        sub = watch.subscribers[0]
        sub.SILENT_PROBE_S = 0.0
        watch.poll()  # the first poll: history (nothing yet)
        assert not watch.pub_silent
        publisher.publish([stored([5, 6])], send=False)  # published, never delivered on the PUB socket
        publisher.publish([stored([9], parent=6)], send=False)
        watch.poll()
        assert watch.pub_silent and sub.stats.replayed_while_silent == 2
        assert sorted(sub.tree.blocks((0, "GPU"))) == [5, 6, 9] and sub.stats.received == 0
        watch.close()
    finally:
        publisher.close()


@pytest.mark.parametrize(
    ("endpoint", "binds", "address"),
    [
        ("tcp://*:6000", True, "tcp://127.0.0.1:6000"),
        ("tcp://[::]:6000", True, "tcp://127.0.0.1:6000"),
        ("tcp://127.0.0.1:6000", False, "tcp://127.0.0.1:6000"),
        ("tcp://indexer.local:6000", False, "tcp://indexer.local:6000"),
    ],
)
def test_core_serve_follows_vllms_bind_rule(endpoint, binds, address):
    assert is_bind_endpoint(endpoint) is binds
    config = parse_kv_events_config(
        json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": "tcp://*:6001"}),
        "127.0.0.1",
    )
    assert (config.bind, config.endpoint, config.replay_endpoint) == (binds, address, "tcp://127.0.0.1:6001")
