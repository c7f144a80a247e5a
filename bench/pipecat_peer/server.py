"""A minimal Pipecat media-stream server for the peer comparison (issue 8, item 4).

Runs in its own venv (``bench/.venv-pipecat``, ``pip install
'pipecat-ai[websocket]' uvicorn``); it never imports callbridge. One Twilio
media stream per WebSocket on ``/twilio``:

    FastAPIWebsocketTransport(TwilioFrameSerializer)   # Pipecat's own Twilio path
      -> VADProcessor(SileroVADAnalyzer())             # Pipecat's default VAD and params
      -> UserTurnProcessor(start=[VADUserTurnStartStrategy()])  # interruptions on
      -> KovaTTSService                                # below: Kova over WebSocket
      -> transport.output()

On connect the bot speaks ``--greeting`` (a ``TTSSpeakFrame``). A user turn
start broadcasts an interruption, which the Twilio serializer turns into
``clear``, exactly as a Pipecat voice bot does. There is no STT and no LLM:
the comparison is about the media path.

``KovaTTSService`` is deliberately small: one Kova WebSocket per call,
``start_context`` / ``send_text`` / ``flush`` per utterance, audio chunks
pushed as ``TTSAudioRawFrame`` at the asked-for rate (pcm s16le), and
``close_context`` on interruption.

    python server.py --port 8765 --tts ws://127.0.0.1:PORT/v1/ws/kova [--rate 24000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import uuid
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import uvicorn
import websockets
from fastapi import FastAPI, WebSocket
from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transports.websocket.fastapi import (
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)
from pipecat.turns.user_start.vad_user_turn_start_strategy import VADUserTurnStartStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import (
    SpeechTimeoutUserTurnStopStrategy,
)
from pipecat.turns.user_turn_processor import UserTurnProcessor
from pipecat.turns.user_turn_strategies import UserTurnStrategies


class KovaTTSService(TTSService):
    """Kova (seed 000) over one WebSocket per call: one context per utterance."""

    def __init__(self, *, url: str, api_key: str, rate_hz: int, **kwargs: Any) -> None:
        settings = TTSSettings(model=None, voice="tone", language=None)
        super().__init__(sample_rate=rate_hz, settings=settings, **kwargs)
        self._url = url
        self._api_key = api_key
        self._rate_hz = rate_hz
        self._ws: Any = None
        self._context: str | None = None

    async def _socket(self) -> Any:
        if self._ws is None:
            self._ws = await websockets.connect(
                self._url,
                additional_headers={"Authorization": f"Bearer {self._api_key}"},
                max_size=1 << 22,
            )
        return self._ws

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        ws = await self._socket()
        ctx = f"p{uuid.uuid4().hex[:8]}"
        self._context = ctx
        fmt = {"encoding": "pcm", "sample_rate": self._rate_hz}
        start = {"voice_id": "tone", "model_id": "default", "response_format": fmt}
        await ws.send(json.dumps({"start_context": start, "context_id": ctx}))
        await ws.send(json.dumps({"send_text": text, "context_id": ctx}))
        await ws.send(json.dumps({"flush": True, "context_id": ctx, "flush_id": "f1"}))

        async def chunks() -> AsyncIterator[bytes]:
            async for msg in ws:
                frame = json.loads(msg)
                if frame.get("context_id") != ctx:
                    continue  # a cancelled context's late frames
                if "audio_chunk" in frame:
                    yield base64.b64decode(frame["audio_chunk"])
                elif "flush_completed" in frame or "error" in frame or self._context != ctx:
                    return

        async for out in self._stream_audio_frames_from_iterator(
            chunks(), in_sample_rate=self._rate_hz, context_id=context_id
        ):
            await self.stop_ttfb_metrics()
            yield out
        if self._context == ctx:
            self._context = None
            await ws.send(json.dumps({"close_context": True, "context_id": ctx}))

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame) and self._context and self._ws is not None:
            ctx, self._context = self._context, None
            await self._ws.send(json.dumps({"close_context": True, "context_id": ctx}))
        await super().process_frame(frame, direction)

    async def cleanup(self) -> None:
        await super().cleanup()
        if self._ws is not None:
            await self._ws.close()


def make_app(tts_url: str, rate_hz: int, greeting: str) -> FastAPI:
    app = FastAPI()

    @app.websocket("/twilio")
    async def twilio(websocket: WebSocket) -> None:
        await websocket.accept()
        stream_sid = call_sid = ""
        while not stream_sid:  # connected, then start
            msg = json.loads(await websocket.receive_text())
            if msg.get("event") == "start":
                stream_sid = msg["start"]["streamSid"]
                call_sid = msg["start"]["callSid"]
        serializer = TwilioFrameSerializer(
            stream_sid, call_sid, params=TwilioFrameSerializer.InputParams(auto_hang_up=False)
        )
        transport = FastAPIWebsocketTransport(
            websocket,
            FastAPIWebsocketParams(
                audio_in_enabled=True,
                audio_out_enabled=True,
                add_wav_header=False,
                serializer=serializer,
            ),
        )
        tts = KovaTTSService(url=tts_url, api_key="k", rate_hz=rate_hz)
        turns = UserTurnProcessor(
            user_turn_strategies=UserTurnStrategies(
                start=[VADUserTurnStartStrategy()], stop=[SpeechTimeoutUserTurnStopStrategy()]
            )
        )
        pipeline = Pipeline(
            [
                transport.input(),
                VADProcessor(vad_analyzer=SileroVADAnalyzer()),
                turns,
                tts,
                transport.output(),
            ]
        )
        task = PipelineTask(
            pipeline,
            params=PipelineParams(audio_in_sample_rate=8000, audio_out_sample_rate=rate_hz),
            enable_rtvi=False,
        )
        await task.queue_frames([TTSSpeakFrame(greeting)])
        await PipelineRunner(handle_sigint=False).run(task)

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--tts", required=True)
    ap.add_argument("--rate", type=int, default=24000)
    ap.add_argument("--greeting", default="Hello from pipecat.")
    args = ap.parse_args()
    warnings.simplefilter(
        "ignore", DeprecationWarning
    )  # PipelineTask/Runner: still the documented way
    logger.remove()
    logger.add(lambda m: print(m, end=""), level=os.environ.get("PIPECAT_LOG", "WARNING"))
    app = make_app(args.tts, args.rate, args.greeting)
    asyncio.run(
        uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=args.port, log_level="warning", ws="websockets"
            )
        ).serve()
    )


if __name__ == "__main__":
    main()
