"""Test media made on the spot: espeak-ng speech, audio encoded with PyAV's encoders, slides drawn with Pillow."""

from __future__ import annotations

import io
import subprocess
import tempfile
from pathlib import Path

import numpy as np

RATE = 16_000

# container format -> (PyAV codec, encoder sample rate); Opus only runs at 48 kHz
AV_CODECS = {
    "mp3": ("libmp3lame", RATE),
    "adts": ("aac", RATE),  # raw AAC frames (.aac)
    "ipod": ("aac", RATE),  # M4A
    "webm": ("libopus", 48_000),
    "ogg": ("libopus", 48_000),
}


def espeak(text: str, speed: int = 150) -> np.ndarray:
    """float32 mono speech at 16 kHz, synthesized by espeak-ng (22.05 kHz, resampled with soxr)."""
    from usg.ops.audio import decode_audio

    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run(
            ["espeak-ng", "-v", "en", "-s", str(speed), "-w", str(wav), text], check=True, capture_output=True
        )
        return decode_audio(wav)


class _Unseekable:
    """A write-only file: muxers cannot go back to fill in the duration (a live stream)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()

    def write(self, data: bytes) -> int:
        return self.buf.write(data)

    def seekable(self) -> bool:
        return False


def encode_av(
    samples: np.ndarray, fmt: str, rate: int = RATE, *, seekable: bool = True, codec_rate: int | None = None
) -> bytes:
    """Mono float32 ``samples`` at ``rate`` → the bytes of a ``fmt`` file written by PyAV's encoder
    (``seekable=False``: written as a stream, so the header declares no duration; ``codec_rate``:
    the encoder's sample rate instead of the format's default)."""
    import av

    codec, out_rate = AV_CODECS[fmt]
    out_rate = codec_rate or out_rate
    out = io.BytesIO() if seekable else _Unseekable()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=out_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=out_rate)
        for f in [*resampler.resample(frame), *resampler.resample(None)]:
            container.mux(stream.encode(f))
        container.mux(stream.encode(None))
    return out.getvalue() if isinstance(out, io.BytesIO) else out.buf.getvalue()


def slide_png(title: str, body: str = "") -> bytes:
    """A 640x360 white slide with black text, as PNG bytes (DejaVu Sans if installed, else Pillow's default font)."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (640, 360), "white")
    draw = ImageDraw.Draw(img)
    try:
        big, small = ImageFont.truetype("DejaVuSans.ttf", 40), ImageFont.truetype("DejaVuSans.ttf", 28)
    except OSError:
        big = small = ImageFont.load_default(size=36)
    draw.text((40, 60), title, fill="black", font=big)
    if body:
        draw.text((40, 180), body, fill="black", font=small)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
