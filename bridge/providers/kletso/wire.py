"""Kletso's wire vocabulary, written once for both sides (seed ``002_3ce796c82c11903e.txt``).

JSON text frames (``{"type": "voice.start", ...}``) and binary audio frames
(one kind byte, then PCM s16le at 24 kHz). The client engine (``client.py``)
and the ``tts-server`` session (``server.py``) both take from here the audio
frame's rate, kinds and size limit, the session modes and stop reasons, and
the message, field, state and error-code names (the constants at the end,
one per string both sides write).

Pure: no I/O, no state.
"""

from __future__ import annotations

from typing import Final

SAMPLE_RATE_HZ: Final = 24000
"""Audio both ways: PCM s16le mono at 24 kHz."""
KIND_MIC: Final = 0x01
"""The kind byte of a binary frame of the caller's audio (client -> server)."""
KIND_ASSISTANT: Final = 0x02
"""The kind byte of a binary frame of the agent's audio (server -> client)."""
MAX_FRAME_BYTES: Final = 16 * 1024
"""Largest binary frame, kind byte included."""
MODES: Final = frozenset({"vad", "ptt"})
STOP_REASONS: Final = frozenset({"user", "background"})
CLOSE_POLICY_VIOLATION: Final = 1008


# ------------------------------------------- message, field and value names
# Every string both sides write: message types (``voice.start``,
# ``voice.text``, ``voice.played``...; ``voice.started``, ``voice.state``,
# ``voice.transcript``, ``message.created``, ``voice.interrupted``,
# ``voice.ended``, ``error``...), their fields (camelCase), the voice states
# and the error codes.

ASSISTANT: Final = "assistant"
AUDIO_END_MS: Final = "audioEndMs"
AUDIO_IN_SECONDS: Final = "audioInSeconds"
AUDIO_OUT_SECONDS: Final = "audioOutSeconds"
CLIENT_ID: Final = "clientId"
CODE: Final = "code"
CONFLICT: Final = "conflict"
COST_MICROS: Final = "costMicros"
CURRENT: Final = "current"
DATA: Final = "data"
ERROR: Final = "error"
FINAL: Final = "final"
IDLE: Final = "idle"
IDLE_SECONDS: Final = "idleSeconds"
ITEM_ID: Final = "itemId"
LIMITS: Final = "limits"
LISTENING: Final = "listening"
MAX_SECONDS: Final = "maxSeconds"
MESSAGE: Final = "message"
MESSAGE_CREATED: Final = "message.created"
MODE: Final = "mode"
MODEL: Final = "model"
MS: Final = "ms"
NOT_CONFIGURED: Final = "not_configured"
PTT: Final = "ptt"
REASON: Final = "reason"
ROLE: Final = "role"
SAMPLE_RATE: Final = "sampleRate"
SPEAKING: Final = "speaking"
STATE: Final = "state"
TEXT: Final = "text"
THINKING: Final = "thinking"
TYPE: Final = "type"
USAGE: Final = "usage"
VAD: Final = "vad"
VOICE: Final = "voice"
VOICE_COMMIT: Final = "voice.commit"
VOICE_ENDED: Final = "voice.ended"
VOICE_INTERRUPTED: Final = "voice.interrupted"
VOICE_PLAYED: Final = "voice.played"
VOICE_PROVIDER_ERROR: Final = "voice_provider_error"
VOICE_RATE_LIMITED: Final = "voice_rate_limited"
VOICE_SESSION_ID: Final = "voiceSessionId"
VOICE_START: Final = "voice.start"
VOICE_STARTED: Final = "voice.started"
VOICE_STATE: Final = "voice.state"
VOICE_STOP: Final = "voice.stop"
VOICE_TEXT: Final = "voice.text"
VOICE_TRANSCRIPT: Final = "voice.transcript"
VOICE_UNAVAILABLE: Final = "voice_unavailable"
