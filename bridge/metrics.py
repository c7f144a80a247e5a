"""Prometheus metrics (``prometheus-client``), one registry per daemon.

Histogram buckets resolve milliseconds where the figure is a latency the
project has a goal for (added latency, pacing, barge-in).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

__all__ = ["REJECT_REASONS", "Metrics"]

REJECT_REASONS = (
    # SIP (bridge.sip.guard.REFUSAL_REASONS: counted by the engine)
    "not_allowed",  # source, or caller behind a trusted proxy, outside [sip] allow
    "rate_limited",  # over invite_rate_per_source: dropped, or 503 to a trusted proxy
    "draining",  # SIP INVITE 503 or media-stream upgrade 503 during a drain
    "max_calls",  # SIP INVITE 503 at [sip] max_calls
    "auth_failed",  # SIP digest credentials that do not verify (401)
    # SIP (the leg)
    "overloaded",  # SIP INVITE 503 or upgrade 503: the media clock lags (max_loop_lag_ms)
    "no_route",  # SIP 404 or a stream closed: no route matches
    "no_codec",  # SIP 488: no codec in common
    "srtp_mismatch",  # SIP 488: SDES keys over UDP/TCP, SRTP offered while off, or required
    "no_ports",  # SIP 503: no RTP port pair free
    # media streams
    "bad_signature",  # X-Twilio-Signature / X-Plivo-Signature-V3 does not verify (403)
    "bad_token",  # shared stream token missing or wrong (403)
    "token_malformed",  # single-use stream token (Twilio): malformed
    "token_bad_mac",  # ... its MAC does not verify
    "token_expired",  # ... expired
    "token_replayed",  # ... already used
    "no_credential",  # a public listener's dialect with no credential configured (403)
    "max_streams",  # upgrade 503 at [media_streams] max_streams
    "twiml_replayed",  # POST /twiml for a CallSid that already got a stream token (409)
    # every TCP listener (SIP, media streams, API)
    "connection_limit",  # closed at accept: max_connections or max_connections_per_source
)
"""Every ``reason`` of ``callbridge_rejected_total`` (docs/operations.md); each
starts at 0 so that ``increase()`` and alerts see its first refusal."""

MS_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
SETUP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric the daemon exports, on its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.calls_active = Gauge(
            "callbridge_calls_active", "Calls in progress", ["leg", "route"], registry=r
        )
        self.calls_total = Counter(
            "callbridge_calls_total", "Calls handled", ["leg", "route", "outcome"], registry=r
        )
        self.call_setup_seconds = Histogram(
            "callbridge_call_setup_seconds",
            "Call setup time (offer to answer)",
            ["leg"],
            buckets=SETUP_BUCKETS_S,
            registry=r,
        )
        self.turns_total = Counter(
            "callbridge_turns_total", "Turns spoken", ["provider", "outcome"], registry=r
        )
        self.time_to_first_audio_seconds = Histogram(
            "callbridge_time_to_first_audio_seconds",
            "Turn opened to first provider audio",
            ["provider"],
            buckets=MS_BUCKETS_S,
            registry=r,
        )
        self.added_latency_seconds = Histogram(
            "callbridge_added_latency_seconds",
            "First provider audio byte received to first frame carrying it sent",
            ["leg"],
            buckets=MS_BUCKETS_S,
            registry=r,
        )
        self.pacing_deviation_seconds = Histogram(
            "callbridge_pacing_deviation_seconds",
            "Outbound frame departure minus its deadline",
            ["leg"],
            buckets=MS_BUCKETS_S,
            registry=r,
        )
        self.underruns_total = Counter(
            "callbridge_underruns_total", "Frames sent as silence inside a turn", registry=r
        )
        self.underruns_provider_total = Counter(
            "callbridge_underruns_provider_total",
            "Of the underruns, frames whose audio the provider had not sent yet",
            registry=r,
        )
        self.bargeins_total = Counter(
            "callbridge_bargeins_total", "Turns interrupted", ["reason"], registry=r
        )
        self.bargein_latency_seconds = Histogram(
            "callbridge_bargein_latency_seconds",
            "Detector decision to outbound speech stopped",
            buckets=MS_BUCKETS_S,
            registry=r,
        )
        self.provider_errors_total = Counter(
            "callbridge_provider_errors_total", "Provider errors", ["provider", "kind"], registry=r
        )
        self.provider_reconnects_total = Counter(
            "callbridge_provider_reconnects_total", "Provider reconnects", ["provider"], registry=r
        )
        self.sip_responses_total = Counter(
            "callbridge_sip_responses_total", "SIP responses sent", ["code"], registry=r
        )
        self.rejected_total = Counter(
            "callbridge_rejected_total", "Requests refused", ["reason"], registry=r
        )
        for reason in REJECT_REASONS:
            self.rejected_total.labels(reason)
        self.rtp_packets_lost_total = Counter(
            "callbridge_rtp_packets_lost_total", "Inbound RTP packets lost", registry=r
        )
        self.draining = Gauge("callbridge_draining", "1 while draining", registry=r)
        self.tasks = Gauge("callbridge_tasks", "asyncio tasks alive in the daemon", registry=r)
        self.log_lines_dropped = Gauge(
            "callbridge_log_lines_dropped",
            "Log lines the sink could not write (EPIPE, ENOSPC...) since start",
            registry=r,
        )
        self.gc_thaw_collected_total = Counter(
            "callbridge_gc_thaw_collected",
            "objects found unreachable by a thaw's full collection (cycles; should stay low)",
            registry=r,
        )
        self.calls_unreleased_total = Counter(
            "callbridge_calls_unreleased",
            "ended calls still alive 30 s later (in a reference cycle, or held: a leak)",
            registry=r,
        )
        # the prompt cache (bridge.providers.prompts), per provider name of the config
        self.prompt_cache_hits_total = Counter(
            "callbridge_prompt_cache_hits", "Prompts served from the cache", ["provider"],
            registry=r,
        )  # fmt: skip
        self.prompt_cache_misses_total = Counter(
            "callbridge_prompt_cache_misses", "Prompt requests that started a render",
            ["provider"], registry=r,
        )  # fmt: skip
        self.prompt_cache_coalesced_total = Counter(
            "callbridge_prompt_cache_coalesced",
            "Prompt requests that joined a render in flight (no render of their own)",
            ["provider"], registry=r,
        )  # fmt: skip
        self.prompt_cache_render_failures_total = Counter(
            "callbridge_prompt_cache_render_failures",
            "Prompt renders failed for good (after the retry; their waiters failed together)",
            ["provider"], registry=r,
        )  # fmt: skip
        self.prompt_cache_bytes = Gauge(
            "callbridge_prompt_cache_bytes", "Rendered prompt bytes held (memory: audio; "
            "disk: files in cache_dir)", ["where"], registry=r,
        )  # fmt: skip
        # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total...
        ProcessCollector(registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
