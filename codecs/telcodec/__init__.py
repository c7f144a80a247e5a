"""telcodec: telephony audio codecs for callbridge.

G.711 (``g711``), G.722 wideband through PyAV (``g722``, stateful: one
encoder or decoder per stream; ``av`` is imported only when one is made),
Opus through PyAV's libopus (``opus``, 16 kHz side, one packet per 20 ms,
stateful and lazy the same way), L16 byte order (``l16``), streaming resampling over soxr
(``resample``), exact 20 ms framing (``framing``), provider-to-telephony
transcoding pipelines (``transcode``) and DTMF tone generation and detection
(``dtmf``). Everything is pure computation on bytes and numpy arrays: no I/O,
no clock, and no dependency on ``bridge``.
"""

__version__ = "0.1.0"
