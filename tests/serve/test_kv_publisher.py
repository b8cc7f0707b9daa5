"""The BlockManager-to-events tracker (evictions included) and our ZMQ publisher read by our subscriber."""

import random
import time

from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.subscriber import KVEventSubscriber
from core.live.tree import CachedBlockTree
from core.paging.block_manager import BlockManager
from core.serve.kv_publisher import CacheEventTracker, ZmqEventPublisher


def test_tracker_events_rebuild_the_cache_after_every_operation():
    rng = random.Random(0)
    manager = BlockManager(12, 4, enable_prefix_caching=True)
    tracker, tree = CacheEventTracker(manager), CachedBlockTree()
    live = []
    for step in range(300):
        if live and (len(live) > 3 or rng.random() < 0.4):
            manager.free(live.pop(rng.randrange(len(live))))
        else:
            prefix = rng.choice([[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], []])
            tokens = prefix + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
            if manager.can_allocate(len(tokens)):
                manager.allocate(step, tokens)
                live.append(step)
        for event in tracker.changes():
            tree.apply(event)
        keys = manager.cached_block_keys()
        got = tree.blocks((0, "GPU"))
        assert {h: (b.parent_hash, b.token_ids) for h, b in got.items()} == keys
    assert manager.prefix_cache_stats.evictions_blocks > 0  # evictions happened and were announced


def test_publisher_framing_and_replay_read_by_the_subscriber():
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv-events")
    manager = BlockManager(8, 2, enable_prefix_caching=True)
    tracker = CacheEventTracker(manager)
    manager.allocate("a", [1, 2, 3, 4, 5])
    pub.publish(tracker.changes())  # published before anyone listens: only the replay buffer has it
    time.sleep(0.2)
    limits = Limits()
    sub = KVEventSubscriber(
        check_events_endpoint(pub.endpoint, limits),
        replay_endpoint=check_events_endpoint(pub.replay_endpoint, limits),
    )
    try:
        time.sleep(0.3)
        manager.allocate("b", [1, 2, 7, 7, 7])
        pub.publish(tracker.changes())
        for _ in range(30):
            sub.poll(0.1)
            if sub.stats.last_seq == 1:
                break
        assert sub.stats.replayed == 1 and sub.stats.lost == 0  # seq 0 came from the replay socket
        assert {h: (b.parent_hash, b.token_ids) for h, b in sub.tree.blocks((0, "GPU")).items()} == (
            manager.cached_block_keys()
        )
    finally:
        sub.close()
        pub.close()
