"""Re-create sample.png: a small invoice-like page rendered with DejaVu fonts (shipped in matplotlib)."""

from pathlib import Path

from PIL import Image

from usg.testing.documents import Line, render_document

LINES = [
    Line("INVOICE 2026-0117", size=34, font="DejaVuSans-Bold.ttf"),
    Line("Acme Robotics Ltd, 12 Harbour Road", size=26),
    Line("Item: servo motor x4   EUR 312.40", size=26, font="DejaVuSerif.ttf"),
    Line("Item: control board x1   EUR 89.00", size=26, font="DejaVuSansMono.ttf"),
    Line("Total due: EUR 401.40", size=30, font="DejaVuSans-Bold.ttf"),
    Line("Payment within 30 days", size=24, angle=4),
]

if __name__ == "__main__":
    out = Path(__file__).with_name("sample.png")
    Image.fromarray(render_document(LINES)).save(out, optimize=True)
    print(out)
