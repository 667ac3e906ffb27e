"""The HTML pages gpufleet writes, seen in headless Chromium (Debian's `chromium`, installed by
`make browser`, which `make test` runs first).

Each page is served over loopback HTTP, as a user's browser would read the folder, and loaded
twice: in a harness page (the test's own) whose script waits for the page's load and reports
every image that did not decode (`naturalWidth` 0); and alone, for a screenshot kept in
build/screenshots/. Chromium's own log (`--enable-logging=stderr --log-level=0`) carries the
page's console messages, without their level: the pages run no script, so any message there
fails the test, as a missing image does.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.cli.review import render_page, review_document
from gpufleet.cli.usage_page import write_report
from gpufleet.domain.boot import STOCK_TARGETS
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.review import ReviewedJob
from gpufleet.sim.report import PLOTS
from tests.simulation.test_simulator import DATA_FREE, synthetic_jobs, write_philly_csv
from tests.simulation.test_simulator import cli as simulate_cli
from tests.unit.test_review import job as reviewed_job
from tests.unit.test_review import used
from tests.unit.test_usage_page import HOSTILE, T0, job, node

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
HARNESS = """<!DOCTYPE html><html><body><pre id="result">pending</pre>
<iframe id="page" src="{page}" width="1000" height="1400"></iframe>
<script>
const frame = document.getElementById("page");
frame.addEventListener("load", () => {{
  const images = Array.from(frame.contentDocument.images);
  const broken = images.filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.src);
  document.getElementById("result").textContent =
    JSON.stringify({{images: images.length, broken: broken}});
}});
</script></body></html>
"""
# What Chromium logs of a page's console message: `...:INFO:CONSOLE:12] "text", source: URL`.
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (?P<message>.*)$")


def _browser() -> str:
    if CHROMIUM is None:
        pytest.fail(
            "chromium is not installed: run `make browser` (apt-get install chromium); the "
            "HTML pages are checked in it (issue #21 point 4)"
        )
    return CHROMIUM


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The pages' folder on a loopback HTTP server: its URL, and the folder."""
    root = tmp_path_factory.mktemp("pages")
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


def chromium(*arguments: str) -> subprocess.CompletedProcess[str]:
    argv = [
        _browser(),
        "--headless",
        "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
        "--disable-gpu",
        "--no-first-run",
        "--enable-logging=stderr",
        "--log-level=0",
        "--virtual-time-budget=10000",
        *arguments,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def console_messages(stderr: str) -> list[str]:
    return [m.group("message") for line in stderr.splitlines() if (m := _CONSOLE.search(line))]


def check_page(base: str, root: Path, page: str) -> dict[str, object]:
    """Load `page` (a path under `root`) in Chromium: what the harness saw, after failing the
    test on a console error; its screenshot kept."""
    harness = root / f"harness-{page.replace('/', '-')}"
    harness.write_text(HARNESS.format(page=f"/{page}"))
    loaded = chromium("--dump-dom", f"{base}/{harness.name}")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    messages = console_messages(loaded.stderr)
    assert not messages, f"console messages on {page}: {messages}"
    match = re.search(r'<pre id="result">(.*?)</pre>', loaded.stdout, re.S)
    assert match is not None and match.group(1) != "pending", loaded.stdout[-2000:]
    result: dict[str, object] = json.loads(match.group(1))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{page.replace('/', '-')}.png"
    taken = chromium(f"--screenshot={shot}", "--window-size=1000,1400", f"{base}/{page}")
    assert taken.returncode == 0 and shot.stat().st_size > 0, taken.stderr[-2000:]
    return result


def test_the_report_page_loads_without_console_errors_and_shows_both_images(
    served: tuple[str, Path],
) -> None:
    base, root = served
    write_report(job(), [node("i-1"), node(HOSTILE)], root / "report", now=T0 + 9999)
    result = check_page(base, root, "report/index.html")
    assert result == {"images": 2, "broken": []}


def test_a_missing_image_and_a_console_error_are_caught(served: tuple[str, Path]) -> None:
    """The check can fail: the same page without its timeline image, and a script error."""
    base, root = served
    write_report(job(), [node("i-1")], root / "broken", now=T0 + 9999)
    (root / "broken" / "timeline.png").unlink()
    page = root / "broken" / "index.html"
    page.write_text(page.read_text().replace("</body>", "<script>missing();</script></body>"))
    harness = root / "harness-broken.html"
    harness.write_text(HARNESS.format(page="/broken/index.html"))
    loaded = chromium("--dump-dom", f"{base}/{harness.name}")
    match = re.search(r'<pre id="result">(.*?)</pre>', loaded.stdout, re.S)
    assert match is not None
    assert any("ReferenceError" in m for m in console_messages(loaded.stderr))
    result = json.loads(match.group(1))
    assert result["images"] == 2 and [Path(src).name for src in result["broken"]] == [
        "timeline.png"
    ]


def test_the_review_page_loads_without_console_errors(served: tuple[str, Path]) -> None:
    base, root = served
    history = [
        ReviewedJob(reviewed_job(), used(8000.0, util=2.0)),
        ReviewedJob(reviewed_job(name="steady", capacity="on-demand"), ()),
    ]
    document = review_document(history, load_bundled(), "us-east-1", STOCK_TARGETS, T0, T0 + 86400)
    document.update(since="30d", team=HOSTILE)
    (root / "review").mkdir(exist_ok=True)
    (root / "review" / "index.html").write_text(render_page(document))
    assert check_page(base, root, "review/index.html") == {"images": 0, "broken": []}


def test_the_simulators_report_loads_without_console_errors_and_shows_every_plot(
    served: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpufleet simulate --report DIR`, as a user runs it, on a small synthetic trace."""
    base, root = served
    trace = write_philly_csv(tmp_path / "philly.csv", synthetic_jobs())
    argv = ["--trace", str(trace), "--format", "philly", "--report", str(root / "simulate")]
    assert simulate_cli([*argv, *DATA_FREE, "--compare", "fifo-spot"]) == 0
    capsys.readouterr()
    assert check_page(base, root, "simulate/index.html") == {"images": len(PLOTS), "broken": []}
