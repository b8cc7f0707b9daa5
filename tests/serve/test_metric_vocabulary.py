"""One metric vocabulary (`core.metric_names`) on both sides of the wire: what `core.serve`'s exporter publishes,
the Live page's parser reads back field for field under vLLM's current names, labels and cache-config labels."""

from prometheus_client.parser import text_string_to_metric_families

from core.live.metrics import parse_vllm_metrics
from core.metric_names import CACHE_CONFIG_INFO, COUNTERS, GAUGES, HISTOGRAMS, current_name
from core.serve.exporter import ServerMetrics


def served() -> str:
    metrics = ServerMetrics("m", block_size=4, num_gpu_blocks=32, prefix_caching=True, dtype="float32")
    metrics.request_finished(
        "stop"
    )  # request_success has a finished_reason label: no sample until one finishes
    return metrics.render().decode()


def test_every_field_published_is_read_back_under_its_current_name():
    parsed = parse_vllm_metrics(served())
    fields = [*GAUGES, *COUNTERS, *HISTOGRAMS]
    assert len(fields) == 20 and [f for f in fields if getattr(parsed, f) is None] == []
    assert not parsed.legacy_names  # the exporter uses the names vLLM publishes today
    assert (parsed.model_names, parsed.engines, parsed.block_size, parsed.num_gpu_blocks) == (
        ("m",),
        ("0",),
        4,
        32,
    )


def test_the_exporter_publishes_nothing_outside_the_vocabulary():
    """Families as prometheus_client's parser names them (a counter without its `_total`), less the `_created`
    gauges prometheus_client adds beside each counter and histogram (which the Live page ignores)."""
    names = {family.name for family in text_string_to_metric_families(served())}
    published = {name for name in names if not name.endswith("_created")}
    assert published == {current_name(f) for f in [*GAUGES, *COUNTERS, *HISTOGRAMS]} | {CACHE_CONFIG_INFO}
    assert names - published == {f"{current_name(f)}_created" for f in [*COUNTERS, *HISTOGRAMS]}
    assert (
        current_name("itl") == "vllm:inter_token_latency_seconds"
    )  # vLLM V1's current name, not the old TPOT
