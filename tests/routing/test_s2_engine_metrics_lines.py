"""Engine-metrics parsing reads only the lines of the names it uses (routing/engine_metrics.py)."""
from __future__ import annotations

from routing.engine_metrics import parse_engine_metrics, read_lines

HISTOGRAM = "".join(f'vllm:time_to_first_token_seconds_bucket{{le="{b}",model_name="m"}} {i}\n'
                    for i, b in enumerate(("0.1", "0.5", "1.0", "+Inf")))
TEXT = (
    "# HELP vllm:time_to_first_token_seconds TTFT.\n# TYPE vllm:time_to_first_token_seconds histogram\n"
    + HISTOGRAM
    + "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m",engine="0"} 2.0\n'
    'vllm:num_requests_running{model_name="m",engine="1"} 1.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 7.0\n'
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{model_name="m"} 30.0\n'
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{model_name="m"} 120.0\n'
)


def test_values_are_those_of_the_whole_text() -> None:
    s = parse_engine_metrics(TEXT)
    assert (s.engine, s.running, s.waiting, s.prefix_hit_rate) == ("vllm", 3.0, 7.0, 0.25)
    assert "time_to_first_token" not in read_lines(TEXT)
    assert parse_engine_metrics(read_lines(TEXT)) == s


def test_a_malformed_line_of_an_unread_name_does_not_lose_the_sample() -> None:
    # an engine's other families (histograms, custom metrics) no longer reach the parser
    s = parse_engine_metrics(TEXT + 'vllm:some_histogram_bucket{le="1" 3 garbage\n')
    assert (s.engine, s.running, s.waiting) == ("vllm", 3.0, 7.0)


def test_a_malformed_line_of_a_read_name_still_raises() -> None:
    import pytest

    with pytest.raises(ValueError):
        parse_engine_metrics(TEXT + 'vllm:num_requests_waiting{model_name="m" 3 garbage\n')
