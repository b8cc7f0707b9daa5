"""Our ZMQ publisher (vLLM's framing and replay) carrying the events a BlockManager's pool queues, read by our
subscriber: its tree holds exactly the hashes the pool has cached."""

import time

from core.limits import Limits
from core.live.addresses import check_events_endpoint
from core.live.subscriber import KVEventSubscriber
from core.paging.block_manager import BlockManager
from core.serve.kv_publisher import ZmqEventPublisher


def test_publisher_framing_and_replay_read_by_the_subscriber():
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv-events")
    manager = BlockManager(4, 2, enable_prefix_caching=True, enable_kv_cache_events=True)
    manager.allocate("a", [1, 2, 3, 4, 5])
    pub.publish(manager.take_events())  # seq 0, before anyone listens: only the replay buffer has it
    time.sleep(0.2)
    limits = Limits(live_hosts="127.0.0.1")  # loopback, any port: the test's own servers
    sub = KVEventSubscriber(
        check_events_endpoint(pub.endpoint, limits),
        replay_endpoint=check_events_endpoint(pub.replay_endpoint, limits),
    )
    try:
        time.sleep(0.3)
        manager.free("a")
        manager.allocate("b", [7, 7, 8, 8, 9])  # 3 blocks of a 4-block pool: evicts a cached block of "a"
        pub.publish(manager.take_events())  # seq 1
        for _ in range(30):
            sub.poll(0.1)
            if sub.stats.last_seq == 1:
                break
        assert sub.stats.replayed >= 1 and sub.stats.lost == 0  # seq 0 came from the replay socket
        assert manager.prefix_cache_stats.evictions_blocks >= 1
        cached = {h for _, h in manager.pool.cached_hashes()}
        assert set(sub.tree.blocks((0, "GPU"))) == cached and len(cached) == 3
    finally:
        sub.close()
        pub.close()
