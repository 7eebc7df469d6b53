"""The built site in a real browser (headless Chromium, driven by playwright), opened from
file:// as a reader without a server or a network would: every page at 1280 px (a laptop) and
390 px (a phone), light and dark.

It fails on what a reader sees go wrong and the HTML checks in test_docs.py cannot see:
- a table or code block cut off or scrolling sideways at 1280 px (the 120-column tables the
  commands print must fit beside the navigation);
- a page wider than a 390 px phone screen (code may scroll inside its own box there);
- any request that leaves file:// (the site promises to fetch nothing);
- a console error or an uncaught script error, in either colour scheme.

Needs the `playwright` Python package and a Chromium executable (Debian: apt-get install
chromium); playwright's own browser download is not used. Skipped, saying which is missing, when
either is absent. SMEARCLI_SCREENSHOTS=DIR saves a full-page screenshot of every page and width
there (never into the repository).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WIDE, PHONE = 1280, 390
HEIGHT = 900
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SHOTS = os.environ.get("SMEARCLI_SCREENSHOTS")

# Measured in the page: every table and code block in the article, how far its content runs
# past its own box (the part a reader must scroll to, or cannot see at all) and past the
# article's right edge, and how wide the whole document is.
MEASURE = """() => {
  const article = document.querySelector('.md-content__inner') || document.body;
  const right = article.getBoundingClientRect().right;
  const out = [];
  const name = (el) => {
    let before = el, title = '';
    while (before && !title) {
      before = before.previousElementSibling || before.parentElement;
      if (before && /^H[1-4]$/.test(before.tagName)) title = before.textContent.replace(/[\\s¶]+/g, ' ').trim();
    }
    const text = (el.textContent || '').trim().split('\\n')[0].slice(0, 50);
    return (title ? '[' + title.slice(0, 40) + '] ' : '') + JSON.stringify(text);
  };
  for (const el of article.querySelectorAll('table, pre')) {
    if (el.closest('table') && el.tagName === 'PRE') continue;  // a pre inside a table cell
    if (el.offsetParent === null) continue;  // hidden (a closed details, a tab not shown)
    // the box that clips or scrolls it: a table's scroll wrapper, a pre's code element
    const boxes = [el];
    if (el.tagName === 'TABLE') {
      const wrap = el.closest('.md-typeset__scrollwrap, .md-typeset__table');
      if (wrap) boxes.push(wrap);
    } else {
      const code = el.querySelector(':scope > code');
      if (code) boxes.push(code);
    }
    let hidden = 0;
    for (const b of boxes) hidden = Math.max(hidden, b.scrollWidth - b.clientWidth);
    const past = Math.round(el.getBoundingClientRect().right - right);
    out.push({tag: el.tagName.toLowerCase(), what: name(el), hidden: Math.round(hidden), past,
              output: !!el.closest('.jp-OutputArea-output')});
  }
  return {
    items: out,
    docWidth: document.documentElement.scrollWidth,
    scheme: document.body.getAttribute('data-md-color-scheme'),
  };
}"""


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium executable found (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        except Exception as e:  # noqa: BLE001 - a browser that cannot start: say why, skip
            pytest.skip(f"cannot start {exe}: {e}")
        yield b
        b.close()


def _pages(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html"))


class Visit:
    """One browser context (viewport, colour scheme) that records what every page it opens
    requests from other hosts and logs as errors."""

    def __init__(self, browser, width: int, scheme: str = "light"):
        self.context = browser.new_context(viewport={"width": width, "height": HEIGHT},
                                           color_scheme=scheme, device_scale_factor=1)
        self.width, self.scheme = width, scheme
        self.problems: list[str] = []
        self.current = ""
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.problems.append(f"{self.current}: script error: {e}"))

    def _route(self, route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            self.problems.append(f"{self.current}: request to another host: {url}")
            route.abort()

    def _console(self, msg):
        if msg.type == "error":
            self.problems.append(f"{self.current}: console error: {msg.text}")

    def open(self, site: Path, rel: str) -> dict:
        self.current = f"{rel} @{self.width}px {self.scheme}"
        self.page.goto((site / rel).as_uri(), wait_until="load")
        # material's scripts lay the page out after load (tables wrapped, code buttons added)
        self.page.wait_for_timeout(50)
        if SHOTS:
            shot = Path(SHOTS) / f"{rel.replace('/', '_')[:-5]}-{self.width}-{self.scheme}.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(shot), full_page=True)
        return self.page.evaluate(MEASURE)

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def wide(browser, built_site):
    v = Visit(browser, WIDE)
    v.measured = {rel: v.open(built_site, rel) for rel in _pages(built_site)}
    yield v
    v.close()


@pytest.fixture(scope="module")
def phone(browser, built_site):
    v = Visit(browser, PHONE)
    v.measured = {rel: v.open(built_site, rel) for rel in _pages(built_site)}
    yield v
    v.close()


def test_every_page_was_opened(wide, built_site):
    assert "index.html" in wide.measured and len(wide.measured) == len(_pages(built_site))
    # the measurement sees the content: the home page has at least one code block
    assert any(i["tag"] == "pre" for i in wide.measured["index.html"]["items"])


def _not_fitting(wide, outputs: bool) -> list[str]:
    return [f"{rel}: <{i['tag']}> {i['what']}: {i['hidden']} px hidden, {i['past']} px past the article"
            for rel, m in wide.measured.items() for i in m["items"]
            if i["output"] == outputs and (i["hidden"] > 1 or i["past"] > 1)]


def test_tables_and_code_fit_at_1280px(wide):
    """Tables, code and command output in the pages, and notebook code cells (wider lines wrap
    at a space, extra.css), are whole at 1280 px: nothing cut off, nothing to scroll."""
    bad = _not_fitting(wide, outputs=False)
    assert not bad, f"{len(bad)} table(s)/code block(s) do not fit at {WIDE} px:\n" + "\n".join(bad)


def test_notebook_outputs_fit_at_1280px(wide):
    """Printed notebook output keeps its lines (it would scroll in its box), so the notebooks
    print lines that fit: listings one after the other, long verdicts wrapped at 100 columns."""
    bad = _not_fitting(wide, outputs=True)
    assert not bad, f"{len(bad)} notebook output(s) do not fit at {WIDE} px:\n" + "\n".join(bad)


def test_no_page_is_wider_than_a_phone(phone):
    bad = [f"{rel}: document {m['docWidth']} px wide" for rel, m in phone.measured.items()
           if m["docWidth"] > PHONE]
    assert not bad, f"pages wider than a {PHONE} px screen:\n" + "\n".join(bad)


def test_nothing_from_the_network_and_no_errors(wide, phone):
    problems = wide.problems + phone.problems
    assert not problems, "\n".join(problems)


def test_dark_mode_follows_the_system_and_loads_cleanly(browser, built_site):
    v = Visit(browser, WIDE, scheme="dark")
    try:
        schemes = {rel: v.open(built_site, rel)["scheme"] for rel in
                   ["index.html", "notebooks/01-the-bug.html", "reference/api.html", "404.html"]
                   if (built_site / rel).is_file()}
    finally:
        v.close()
    assert not v.problems, "\n".join(v.problems)
    assert set(schemes.values()) == {"slate"}, f"dark system setting, but the page scheme is {schemes}"
