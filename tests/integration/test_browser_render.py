"""What USG renders for people, looked at in a real headless Chromium (issue #22, item 10):
the doctor's HTML report, the bench plots and the docs site are drawn (a screenshot that is not
blank), styled (computed CSS), and show their key text; images decode.

Needs ``pip install 'usg[browser]'`` (Playwright) and a Chromium: Playwright's own, or Debian's
``chromium`` package (.ci/run installs it; ``USG_CHROMIUM`` names another binary). Set
``USG_SCREENSHOTS=DIR`` to keep the screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser import find_chromium, pixel_stats

ROOT = Path(__file__).resolve().parents[2]
sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright: pip install 'usg[browser]'")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        exe = find_chromium(p)
        if exe is None:
            pytest.skip(
                "no Chromium: apt-get install chromium (or `playwright install chromium`, or USG_CHROMIUM=PATH)"
            )
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    context.close()


def _shot(page, name: str, tmp_path: Path) -> bytes:
    png = page.screenshot(full_page=True)
    keep = os.environ.get("USG_SCREENSHOTS")
    out = Path(keep) if keep else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.png").write_bytes(png)
    return png


def _usg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("usg", path=str(Path(sys.executable).parent)) or "usg"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_doctor_html_report_renders_with_its_findings(page, tmp_path: Path) -> None:
    pytest.importorskip("rapidocr_onnxruntime", reason="the report checks the bundled PP-OCR det model (usg[ocr])")
    import rapidocr_onnxruntime

    det = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
    targets = [str(det), str(ROOT / "examples" / "document_ocr" / "graph.yaml"), "--target", "ort=1.20,tensorrt=10.3"]
    html = _usg("doctor", *targets, "--format", "html", "-o", str(tmp_path / "report.html"), cwd=tmp_path)
    assert html.returncode == 0, html.stderr
    doc = _usg("doctor", *targets, "--format", "json", cwd=tmp_path)
    findings = json.loads(doc.stdout)["findings"]
    assert findings, "the det model under a TensorRT target has findings to show"

    page.goto((tmp_path / "report.html").as_uri())
    stats = pixel_stats(_shot(page, "doctor-report", tmp_path))
    assert not stats.blank(), stats
    for text in ("usg doctor report", "Root-cause matrix", "Findings", "warning(s)"):
        assert page.get_by_text(text).first.is_visible(), text
    first = findings[0]
    assert page.locator("code", has_text=first["code"]).first.is_visible(), first["code"]
    badge = page.locator(f".sev.{first['severity']}").first
    assert badge.is_visible()
    colour = badge.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), "the report's inline CSS did not apply"
    assert page.errors == []


def test_bench_plots_decode_and_show_curves(page, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plots need usg[report]")
    from usg.bench.loadgen import LoadResult
    from usg.bench.plots import write_plots
    from usg.bench.report import BenchReport

    report = BenchReport("examples/document_ocr/graph.yaml", None, "closed", 5.0, 1.0)
    for system, base in (("usg", 120.0), ("sequential", 310.0)):
        for clients in (1, 8, 32):
            r = LoadResult(system, "closed", clients, None, 5.0)
            mean_ms = base * (1 + clients / 4)
            r.latencies_ms = [mean_ms * (0.6 + 0.8 * i / 59) for i in range(60)]
            r.duration_s = 60 * mean_ms / 1000 / clients  # a closed loop: clients / latency requests per second
            report.results.append(r)
    paths = write_plots(report, tmp_path / "plots")
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png"]
    for p in paths:
        stats = pixel_stats(p.read_bytes())
        assert not stats.blank() and stats.colours > 8, (p.name, stats)  # axes, labels and coloured curves
    fig = '<figure><img src="{0}" alt="{1}"><figcaption>{0}</figcaption></figure>'
    imgs = "".join(fig.format(p.name, p.stem) for p in paths)
    (tmp_path / "plots" / "index.html").write_text(f"<!DOCTYPE html><html><body>{imgs}</body></html>", encoding="utf-8")
    page.goto((tmp_path / "plots" / "index.html").as_uri())
    for p in paths:
        img = page.locator(f'img[alt="{p.stem}"]')
        assert img.is_visible()
        size = img.evaluate("e => [e.complete, e.naturalWidth, e.naturalHeight]")
        assert size[0] and size[1] > 300 and size[2] > 200, (p.name, size)
    assert not pixel_stats(_shot(page, "bench-plots", tmp_path)).blank()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs site needs usg[docs]")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    ("page_path", "heading", "texts"),
    [
        ("index.html", "USG — Unified Serving Graph", ("Get started", "Code blocks in these pages")),
        ("quickstart/index.html", "Quick start: your own model", ("One Python node", "Model options")),
    ],
)
def test_docs_site_pages_render_with_theme_and_picture(page, site: Path, tmp_path: Path, page_path, heading, texts):
    page.goto((site / page_path).as_uri())
    page.wait_for_load_state("load")
    assert page.locator("h1", has_text=heading).first.is_visible()
    for text in texts:
        assert page.locator("h2", has_text=text).first.is_visible(), text
    header = page.locator(".md-header").first
    assert header.is_visible(), "the Material theme's header is missing: its CSS did not load"
    colour = header.evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour not in ("rgba(0, 0, 0, 0)", "transparent", "rgb(255, 255, 255)"), colour
    assert page.locator("nav.md-nav").count() > 0, "no navigation"
    stats = pixel_stats(_shot(page, "site-" + page_path.replace("/", "-"), tmp_path))
    assert not stats.blank(), stats
    if page_path == "index.html":
        img = page.locator('img[src*="document_ocr.svg"]').first
        img.scroll_into_view_if_needed()
        size = img.evaluate("e => [e.complete, e.naturalWidth, e.naturalHeight]")
        assert size[0] and size[1] > 200 and size[2] > 200, size  # the graph picture decoded
