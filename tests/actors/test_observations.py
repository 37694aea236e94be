"""actors.observations: vLLM Prometheus text -> per-engine samples."""

from __future__ import annotations

import pytest

from actors.observations import EngineSample, ObservationParseError, local_engines, parse_vllm_metrics

SCRAPE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.7
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m, with \\"comma\\""} 0.5
# HELP vllm:cache_config_info Information of the LLMCache.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="2000"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
"""


def test_parse_vllm_metrics_reads_three_families_per_engine() -> None:
    samples = parse_vllm_metrics(SCRAPE)
    assert samples == {
        0: EngineSample(kv_cache_usage=0.25, running_requests=3, waiting_requests=2, kv_capacity_tokens=16000),
        1: EngineSample(kv_cache_usage=0.5, running_requests=0, waiting_requests=0, kv_capacity_tokens=32000),
    }


def test_parse_vllm_metrics_missing_engine_label_is_engine_zero_and_last_wins() -> None:
    text = (
        "vllm:num_requests_running 1\n"
        'vllm:num_requests_running{model_name="a"} 4\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1\n'
    )
    assert parse_vllm_metrics(text) == {
        0: EngineSample(kv_cache_usage=None, running_requests=4, waiting_requests=None, kv_capacity_tokens=160)
    }


def test_parse_vllm_metrics_engine_without_series_gives_no_observation() -> None:
    text = 'vllm:kv_cache_usage_perc{engine="1"} 0.1\nother_metric{engine="0"} 3\n'
    samples = parse_vllm_metrics(text)
    assert 0 not in samples
    assert samples[1].kv_cache_usage == 0.1


def test_parse_vllm_metrics_rejects_garbage() -> None:
    with pytest.raises(ObservationParseError):
        parse_vllm_metrics("this is { not prometheus\n")


def test_identical_scrapes_parse_once_and_each_caller_gets_its_own_dict() -> None:
    first = parse_vllm_metrics(SCRAPE)
    first[7] = EngineSample(kv_cache_usage=None, running_requests=None, waiting_requests=None, kv_capacity_tokens=None)
    again = parse_vllm_metrics(SCRAPE)
    assert 7 not in again and again == parse_vllm_metrics(SCRAPE.replace("3.0", "3.0", 1))
    changed = parse_vllm_metrics(SCRAPE.replace('engine="0",model_name="m"} 3.0', 'engine="0",model_name="m"} 5.0'))
    assert changed[0].running_requests == 5 and again[0].running_requests == 3
    with pytest.raises(ObservationParseError):  # errors are not remembered as results
        parse_vllm_metrics("<html>oops</html>\n")
    with pytest.raises(ObservationParseError):
        parse_vllm_metrics("<html>oops</html>\n")


# What vLLM 0.8.x (V1) serves: the KV gauge under its old name only, counters with their _total and
# _created samples, and a cache_config_info without an engine label (docs/operations.md §11.7).
SCRAPE_0_8 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.375
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried blocks.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 64.0
# HELP vllm:gpu_prefix_cache_queries_created GPU prefix cache queries, in terms of number of queried blocks.
# TYPE vllm:gpu_prefix_cache_queries_created gauge
vllm:gpu_prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="512"} 1.0
"""


def test_parse_vllm_metrics_reads_the_old_kv_gauge_of_vllm_0_8() -> None:
    assert parse_vllm_metrics(SCRAPE_0_8) == {
        0: EngineSample(kv_cache_usage=0.375, running_requests=2, waiting_requests=1, kv_capacity_tokens=8192)
    }


def test_parse_vllm_metrics_prefers_the_new_kv_gauge_when_both_are_served() -> None:
    """vLLM 0.9.1/0.9.2 to 0.10.x serve both names (the same value in vLLM; different here to see
    which is read), in either order; an engine with only the old one still reads it."""
    new = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    old = 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\nvllm:gpu_cache_usage_perc{engine="1"} 0.75\n'
    for text in (new + old, old + new):
        samples = parse_vllm_metrics(text)
        assert (samples[0].kv_cache_usage, samples[1].kv_cache_usage) == (0.5, 0.75)


def test_local_engines_reads_a_hybrid_lb_servers_engines_from_their_offset() -> None:
    """A hybrid-LB server of the second node of DP 4 lists engines 2 and 3; agentd's two targets
    there are ranks 0 and 1 (docs/operations.md §11.7).  Only an exact contiguous block of as many
    engines as targets, starting above 0, is shifted."""
    a, b, c = (EngineSample(k, 0, 0, None) for k in (0.25, 0.5, 0.75))
    assert local_engines({2: a, 3: b}, 2) == {0: a, 1: b}
    assert local_engines({3: b, 2: a}, 2) == {0: a, 1: b}
    assert local_engines({4: a, 5: b, 6: c}, 3) == {0: a, 1: b, 2: c}
    assert local_engines({3: a}, 1) == {0: a}
    same = {0: a, 1: b}
    assert local_engines(same, 2) is same  # engines from 0: nothing to shift
    for samples, ranks in (
        ({1: a}, 2),  # vLLM before 0.10.1: the last engine only
        ({2: a, 4: b}, 2),  # not contiguous
        ({2: a, 3: b, 4: c}, 2),  # more engines than targets
        ({2: a, 3: b}, 3),  # fewer
        ({}, 2),
        ({2: a}, 0),
    ):
        assert local_engines(samples, ranks) is samples, (samples, ranks)
