"""Write a small lecture into DIR: talk.wav (two espeak-ng phrases) and slide frames captured twice a second.

python examples/lecture_index/make_sample.py DIR
usg run examples/lecture_index/graph.yaml -i audio=DIR/talk.wav -i frames=$(cat DIR/frames.txt) --json

Needs espeak-ng, Pillow and usg[audio]. The first slide is on screen during the first phrase, the
second slide during the second; DIR/frames.txt holds the ``PATH@MS,...`` argument for ``-i frames=``.
"""

import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image, ImageDraw, ImageFont

from usg.ops.audio import decode_audio

RATE = 16_000
PHRASES = ["the quick brown fox jumps over the lazy dog", "seven hundred and forty two apples"]
SLIDES = ["Foxes and dogs", "Counting apples"]
LEAD_MS, GAP_MS, TAIL_MS, FRAME_EVERY_MS = 700, 1500, 600, 500


def slide(title: str) -> bytes:
    """A 640x360 white slide with a black title, as PNG bytes."""
    img = Image.new("RGB", (640, 360), "white")
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 44)
    except OSError:
        font = ImageFont.load_default(size=44)
    ImageDraw.Draw(img).text((40, 150), title, fill="black", font=font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def lecture() -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The samples and each phrase's (start, end) in ms."""
    parts, spans, at = [np.zeros(RATE * LEAD_MS // 1000, np.float32)], [], LEAD_MS
    with tempfile.TemporaryDirectory() as d:
        for text in PHRASES:
            wav = Path(d) / "p.wav"
            subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", str(wav), text], check=True)
            x = decode_audio(wav)
            spans.append((at, at + x.shape[0] * 1000 // RATE))
            at = spans[-1][1] + GAP_MS
            parts += [x, np.zeros(RATE * GAP_MS // 1000, np.float32)]
    parts[-1] = np.zeros(RATE * TAIL_MS // 1000, np.float32)
    return np.concatenate(parts), spans


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "lecture")
    out.mkdir(parents=True, exist_ok=True)
    samples, spans = lecture()
    sf.write(out / "talk.wav", samples, RATE, subtype="PCM_16")
    change_ms = (spans[0][1] + spans[1][0]) // 2  # the slide changes in the pause
    pngs = [slide(t) for t in SLIDES]
    frames = []
    for ms in range(0, samples.shape[0] * 1000 // RATE, FRAME_EVERY_MS):
        path = out / f"f{ms:05d}.png"
        path.write_bytes(pngs[0] if ms < change_ms else pngs[1])
        frames.append(f"{path}@{ms}")
    (out / "frames.txt").write_text(",".join(frames))
    print(out / "talk.wav", f"{len(frames)} frames", spans)
