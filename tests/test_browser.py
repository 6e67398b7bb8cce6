"""The widget notebooks as a learner meets them: JupyterLab in a real (headless) browser.

Starts JupyterLab on loopback (token auth, a random free port), drives Debian's Chromium with
Playwright (no browser download: ``apt-get install chromium``; ``pip install playwright``),
runs every cell of notebooks 03 and 04, moves a slider, and checks that the widget's value,
its printed acceptance numbers and its plot all change. Screenshots go to ``assets/screenshots/``.

Run with ``pytest -m browser`` (deselected by default: it needs Chromium and takes ~2–4 min).
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "assets" / "screenshots"
CHROMIUM_ARGS = [  # a closed network: no background connections, no sandbox as root
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving the repository; yields (base_url, token)."""
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path_factory.mktemp("lab") / "lab.log", "w")
    # Serve a copy: JupyterLab autosaves, and the committed notebooks must keep their outputs.
    root = tmp_path_factory.mktemp("root")
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    for path in (root / "notebooks").glob("*.ipynb"):  # start clean, so "[3]" prompts mean *this* run
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        path.write_text(json.dumps(nb))
    # User settings: start the notebook's kernel without asking, and no "get Jupyter news?" toast.
    settings = tmp_path_factory.mktemp("lab-settings")
    for name, values in {"apputils-extension/sessionDialogs": {"autoStartDefault": True},
                         "apputils-extension/notification": {"fetchNews": "false"}}.items():
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path_factory.mktemp("jupyter-config")),
               JUPYTERLAB_SETTINGS_DIR=str(settings))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.news_url=",
         f"--LabApp.workspaces_dir={tmp_path_factory.mktemp('workspaces')}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--allow-root"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start; see " + log.name)
    yield base, token
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium not found: apt-get install chromium")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        yield browser.new_page(viewport={"width": 1400, "height": 1100})
        browser.close()


ACTIVE = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook tab in front


def run_all_cells(page, base, token, notebook):
    # A workspace per notebook, so JupyterLab does not reopen the previous test's tabs.
    page.goto(f"{base}/lab/workspaces/{notebook[:2]}/tree/notebooks/{notebook}?reset&token={token}")
    page.wait_for_selector(f"{ACTIVE} .jp-Cell", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached", timeout=120_000)
    accept_kernel_dialog(page)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-item[data-command='runmenu:run-all']")
    # Done when no code cell is queued ("[*]") or unrun ("[ ]"), some have run ("[7]"), and the kernel is idle.
    # (Cells whose input is hidden, like the solutions, show an empty prompt.)
    accept_kernel_dialog(page)
    try:
        _wait_for_all_cells(page)
    except Exception:
        shot = Path(tempfile.gettempdir()) / f"specdec_edu_browser_failed_{notebook[:2]}.png"
        page.screenshot(path=str(shot), full_page=True)
        prompts = page.locator(f"{ACTIVE} .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
        print(f"{notebook}: cell prompts {prompts}; screenshot {shot}")
        raise
    stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    errors = page.locator(f"{ACTIVE} {stderr}:has-text('Traceback')")
    assert errors.count() == 0, errors.first.inner_text()


def accept_kernel_dialog(page, wait_ms: int = 2000):
    """If JupyterLab asks which kernel to start (it sometimes does on first open), take its choice."""
    dialog = page.locator(".jp-Dialog:has-text('Select Kernel')")
    try:
        dialog.wait_for(state="visible", timeout=wait_ms)
    except Exception:  # playwright's TimeoutError: no dialog, nothing to do
        return
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()


def _wait_for_all_cells(page):
    page.wait_for_function(
        """(active) => {
            const prompts = [...document.querySelectorAll(active + ' .jp-CodeCell .jp-InputArea-prompt')]
                .map(p => p.textContent.trim()).filter(t => t !== '');
            const status = document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
            return status === 'idle' && prompts.some(t => /\\[\\d+\\]/.test(t))
                && !prompts.some(t => /\\[\\s*\\*?\\s*\\]/.test(t));
        }""",
        arg=ACTIVE, timeout=300_000, polling=1000,
    )


def widget_snapshot(widget):
    """What the learner sees of one widget: slider readouts, its text, the plot's pixels."""
    img = widget.locator("img").first
    return {
        "readouts": widget.locator(".widget-readout").all_inner_texts(),
        "text": " ".join(widget.locator(".widget-html-content").all_inner_texts()),
        "image": img.get_attribute("src") if img.count() else None,
    }


def wait_until_settled(page, widget, quiet_ms: int = 3000, timeout_s: float = 120):
    """Wait until the kernel is idle and the widget's plot has not changed for ``quiet_ms``."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        src = widget_snapshot(widget)["image"]
        idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() > 0
        if src != last or not idle:
            last, since = src, time.monotonic()
        elif (time.monotonic() - since) * 1000 >= quiet_ms:
            return
        page.wait_for_timeout(500)
    pytest.fail("the widget kept redrawing (or the kernel stayed busy)")


def move_slider_and_check(page, widget, key, presses):
    before = widget_snapshot(widget)
    handle = widget.locator(".noUi-handle").first
    handle.focus()
    for _ in range(presses):
        page.keyboard.press(key)
    page.wait_for_timeout(300)
    handle.blur()  # continuous_update=False: the value is sent on release
    page.wait_for_function(
        "([el, src]) => { const i = el.querySelector('img'); return i && i.getAttribute('src') !== src; }",
        arg=[widget.element_handle(), before["image"]], timeout=60_000,
    )
    wait_until_settled(page, widget)  # each key press is a new value: let the last redraw land
    after = widget_snapshot(widget)
    assert after["readouts"] != before["readouts"], "slider value did not change"
    assert after["image"] != before["image"], "plot did not redraw"
    assert after["text"] != before["text"], "printed numbers did not change"
    return before, after


@pytest.mark.parametrize("notebook", ["03_accept_rule.ipynb", "04_corrected_distribution.ipynb"])
def test_widget_notebook_in_browser(lab, page, notebook):
    base, token = lab
    run_all_cells(page, base, token, notebook)
    widget = page.locator(f"{ACTIVE} .jp-OutputArea-output .widget-vbox").first
    widget.scroll_into_view_if_needed()
    SHOTS.mkdir(parents=True, exist_ok=True)
    widget.screenshot(path=str(SHOTS / f"{notebook[:2]}_widget_before.png"))
    before, after = move_slider_and_check(page, widget, "ArrowRight", presses=15)
    widget.screenshot(path=str(SHOTS / f"{notebook[:2]}_widget_after.png"))
    print(notebook, "readouts", before["readouts"], "->", after["readouts"], "|", before["text"][:80], "->", after["text"][:80])
