"""Write talk.wav: two espeak-ng phrases with 1.2 s of silence between them (needs espeak-ng and usg[audio]).

python examples/speech_segments/make_sample.py [OUT.wav]
usg run examples/speech_segments/graph.yaml -i audio=talk.wav --json
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from usg.ops.audio import decode_audio

PHRASES = ["the quick brown fox jumps over the lazy dog", "seven hundred and forty two apples"]
RATE = 16_000

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "talk.wav")
    parts = [np.zeros(RATE * 7 // 10, np.float32)]
    with tempfile.TemporaryDirectory() as d:
        for i, text in enumerate(PHRASES):
            wav = Path(d) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", str(wav), text], check=True)
            parts += [decode_audio(wav), np.zeros(RATE * 12 // 10, np.float32)]
    sf.write(out, np.concatenate(parts), RATE, subtype="PCM_16")
    print(out)
