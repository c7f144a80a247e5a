"""The legs: one adapter per transport around the same call runner (``bridge.io.callrun``).

``sip`` (listeners, user agents, routing) with ``sip_call`` (one call's RTP and per-frame
work); ``streams`` (the media-stream listener and its dialects) with ``stream_call`` (one
carrier WebSocket). A leg gets the daemon's ``Services`` (``bridge.io.services``), never
the daemon itself.
"""
