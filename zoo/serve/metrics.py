"""zoo-serve's Prometheus metrics (`GET /metrics`, the text exposition format, written by prometheus_client): what
it answered, the tokens it read and wrote, its queue and cache, and how long the first token and each later one
took. Names start `zoo_`; where vLLM has a metric of the same meaning the rest of its name is vLLM's
(num_requests_running, num_requests_waiting, prompt_tokens_total, generation_tokens_total, request_success_total,
time_to_first_token_seconds, e2e_request_latency_seconds), so a dashboard built for one reads the other.

Each app has its own registry (two servers in one process count apart). The gauges read the engine when scraped,
from the scraping thread (a value a chunk old at worst); the counters and histograms of a completion are fed by
`watch` on the engine's thread as its tokens are handed out, and those of a request by zoo.serve.operations."""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from zoo.engine.pages import PAGE

# vLLM's buckets (seconds), so the two servers' histograms line up
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)

class Metrics:
    """The metrics of one server; `engine` None for an encoder's (no queue, no cache, no decoding)."""

    content_type = CONTENT_TYPE_LATEST  # /metrics' media type: Prometheus' text format

    def __init__(self, engine=None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("zoo_requests", "HTTP requests answered, by route (the path; 'other' for an unknown "
                                "one) and status code (200, 400, 429, 503 while the server stops, ...)",
                                ["route", "status"], registry=r)
        self.in_progress = Gauge("zoo_requests_in_progress", "HTTP requests being answered now (a stream until its "
                                 "last event); a graceful shutdown waits for these", registry=r)
        self.latency = Histogram("zoo_e2e_request_latency_seconds", "Seconds from a completion, chat or embeddings "
                                 "request's arrival to its response's last byte (a stream's too), answered 200",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("zoo_prompt_tokens", "Prompt tokens of the completion and chat requests "
                                     "accepted (each prompt once, whatever its n: usage.prompt_tokens)", registry=r)
        self.generation_tokens = Counter("zoo_generation_tokens", "Tokens generated and handed to a request "
                                         "(usage.completion_tokens)", registry=r)
        self.success = Counter("zoo_request_success", "Completions finished (n per request), by finish reason "
                               "(stop: end of text or a stop string; length: max_tokens or the context)",
                               ["finished_reason"], registry=r)
        self.ttft = Histogram("zoo_time_to_first_token_seconds", "Seconds from a completion's submission to its "
                              "first token (each of n)", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("zoo_time_per_output_token_seconds", "A completion's mean seconds per token after its "
                              "first (of those with two or more)", buckets=TPOT_BUCKETS, registry=r)
        if engine is None:
            return
        Gauge("zoo_num_requests_running", "Completions holding a row of the KV cache (decoding or prefilling)",
              registry=r).set_function(engine.active)
        Gauge("zoo_num_requests_waiting", "Completions queued for a free row or for KV cache pages", registry=r
              ).set_function(lambda: engine.waiting.qsize() + len(engine.deferred))
        Gauge("zoo_kv_cache_slots_in_use", "KV cache slots holding a running completion's tokens", registry=r
              ).set_function(lambda: slots_in_use(engine))
        Gauge("zoo_kv_cache_slots", "KV cache slots in all (its pages x the page's tokens; --kv-cache-tokens)",
              registry=r).set_function(lambda: (engine.book.pages - 1) * PAGE)
        Gauge("zoo_kv_cache_pages_in_use", "KV cache pages held by running completions", registry=r).set_function(
            lambda: engine.book.held())
        Gauge("zoo_kv_cache_pages_stored", "KV cache pages no completion holds, kept in the prefix store for the "
              "prompts that start with their tokens (taken back when pages run short)", registry=r).set_function(
            lambda: len(engine.book.idle))
        Gauge("zoo_kv_cache_usage_perc", "The share of the KV cache's pages held by running completions (vLLM's "
              "kv_cache_usage_perc)", registry=r).set_function(lambda: engine.book.held() / (engine.book.pages - 1))
        Gauge("zoo_kv_cache_rows_in_use", "Rows (of --slots) decoding or prefilling a completion", registry=r
              ).set_function(engine.active)

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (content_type)."""
        return generate_latest(self.registry)

    def watch(self, choice) -> Callable:
        """`choice.emit` (zoo.serve.choices.Choice: the engine's `emit(ids, finish)`) that also counts its tokens and
        times its first one and the rest, on the engine's thread."""
        submitted, first = time.perf_counter(), None

        def emit(ids: list[int], finish: str | None) -> bool:
            nonlocal first
            now = time.perf_counter()
            if first is None:  # an end of text sampled first is a token too, though no id is handed out
                first = now
                self.ttft.observe(now - submitted)
            self.generation_tokens.inc(len(ids))
            stopped = choice.emit(ids, finish)
            if choice.finish is not None:
                self.success.labels(choice.finish).inc()
                if len(choice.ids) > 1:
                    self.tpot.observe((now - first) / (len(choice.ids) - 1))
            return stopped
        return emit


def slots_in_use(engine) -> int:
    """Slots whose keys and values a running row holds (its prompt so far and what it decoded)."""
    return sum(len(engine.held[i]) for i, r in enumerate(list(engine.rows)) if r is not None)
