"""RTP for SIP call legs, sans-I/O.

``packet`` (RTP/RTCP parse and serialize), ``session`` (one ``RtpSession``
per call leg: send, strict source or latching, RFC 3550 statistics, RTCP,
timeout), ``jitter`` (the receive jitter buffer), ``dtmf`` (RFC 4733 in and
out, in-band fallback), ``ports`` (RTP port allocation) and ``srtp`` (SDES
keys and libsrtp protect/unprotect).
"""
