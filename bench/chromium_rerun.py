"""A chromium tab on a running divviz app that times a control change end to end (bench/interaction.py's method):
from the input event that makes the change to the first animation frame at which the server's script_finished message
for that rerun has arrived (read off the websocket), the app is idle again, every Plotly chart has drawn its SVG and,
where given, a text that depends on the new value shows — all on the page's own clock (performance.now())."""


from playwright.sync_api import TimeoutError as PlaywrightTimeout

FINISHED, FRAGMENT_FINISHED = 0, 3  # ForwardMsg.ScriptFinishedStatus
TWO_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"

# Installed in every document before the app's scripts: stamps the server's script_finished messages as they arrive,
# the app's run state as it changes, and the first input event after `arm()`.
INSTRUMENT = """(() => {
  if (window.__bench) return;
  const b = window.__bench = {finished: [], idleAt: -1, input: 0, armed: false, frames: 0,
    arm() { this.armed = true; this.input = null; this.frames = 0; }};
  function finishedStatus(buffer) {  // a ForwardMsg's top-level field 6 (script_finished, an enum), else -1
    const a = new Uint8Array(buffer); let i = 0;
    const varint = () => { let v = 0, s = 0, c; do { c = a[i++]; v += (c & 0x7f) * 2 ** s; s += 7; } while (c & 0x80);
                           return v; };
    while (i < a.length) {
      const tag = varint(), field = Math.floor(tag / 8), wire = tag % 8;
      if (wire === 0) { const v = varint(); if (field === 6) return v; }
      else if (wire === 2) { const n = varint(); i += n; }  // not `i += varint()`: i is read first
      else if (wire === 1) i += 8;
      else if (wire === 5) i += 4;
      else return -1;
    }
    return -1;
  }
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);  // this listener comes before the app's own handler: the time the message arrived
      this.addEventListener('message', event => {
        if (event.data instanceof ArrayBuffer) {
          const status = finishedStatus(event.data);
          if (status >= 0) b.finished.push([performance.now(), status]);
        }
      });
    }
  };
  for (const type of ['pointerdown', 'mousedown', 'keydown']) {
    window.addEventListener(type, event => {
      if (b.armed) { b.armed = false; b.input = event.timeStamp; }
    }, true);
  }
  new MutationObserver(records => {
    for (const r of records)
      if (r.target.getAttribute('data-test-script-state') === 'notRunning') b.idleAt = performance.now();
  }).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-test-script-state']});
})();"""

# Polled at every animation frame until it returns the time the change was drawn.
DONE = """({accept, text, selector, rerun}) => {
  const b = window.__bench;
  if (b.input === null) return false;
  if (rerun) {
    const done = b.finished.find(([t, status]) => t >= b.input && accept.includes(status));
    if (!done) return false;
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (b.idleAt < done[0] && ++b.frames < 2) return false;
  }
  for (const chart of document.querySelectorAll('[data-testid="stPlotlyChart"]'))
    if (!chart.querySelector('.main-svg')) return false;
  const main = document.querySelector('[data-testid="stMain"]');
  if (!main) return false;
  if (selector) {  // a visible element that matches, holding `text` if given
    const shown = e => e.checkVisibility() && (!text || e.textContent.includes(text));
    if (![...document.querySelectorAll(selector)].some(shown)) return false;
  } else if (text && !main.textContent.includes(text)) return false;
  return performance.now();
}"""


class OutOfTime(BaseException):
    """The global --timeout: not caught by the per-control handlers, it ends the bench (the server with it)."""


class Driver:
    """A chromium tab on the app, with the measurements above."""

    def __init__(self, page, url: str, step_timeout_s: float):
        self.page, self.url, self.timeout_ms = page, url, step_timeout_s * 1000

    def wait_done(self, accept=(FINISHED,), text=None, selector=None, rerun=True, timeout_ms=None) -> float:
        handle = self.page.wait_for_function(DONE, arg={"accept": list(accept), "text": text, "selector": selector,
                                                        "rerun": rerun}, timeout=timeout_ms or self.timeout_ms)
        return (handle.json_value() - self.page.evaluate("window.__bench.input")) / 1000

    def load(self, path: str, timeout_ms: float | None = None) -> float:
        """Open the page's URL; seconds from the navigation's start to the page drawn and idle."""
        self.page.goto(f"{self.url}/{path}", wait_until="commit", timeout=timeout_ms or self.timeout_ms)
        return self.wait_done(selector='[data-testid="stMain"] h1', timeout_ms=timeout_ms)

    def sidebar(self):
        return self.page.locator('[data-testid="stSidebar"]')

    # the kinds of control
    def select(self, label: str, pair: tuple, where=None, **done):
        """A selectbox labelled `label`: pick whichever of `pair` (option indices or option texts' beginnings) is not
        the current value. With one option in `pair` that is already the value (a setup), nothing is timed: 0."""
        page = self.page
        box = (where or page).locator('[data-testid="stSelectbox"]').filter(
            has=page.get_by_text(label, exact=True)).first
        options = page.locator('[data-testid="stSelectboxVirtualDropdown"] [role="option"]')

        def change():
            box.scroll_into_view_if_needed()
            for _ in range(3):  # a scroll still under way closes the popover as it opens: let it pass, retry
                page.evaluate(TWO_FRAMES)
                box.get_by_role("button", name="Open").click()
                try:
                    options.first.wait_for(timeout=3_000)
                    break
                except PlaywrightTimeout:
                    continue
            found = options.evaluate_all("all => all.map(o => [o.dataset.key, o.textContent.trim(), "
                                         "o.getAttribute('aria-selected') === 'true'])")
            keys = [p if isinstance(p, int) else next(int(k) for k, text, _ in found if text.startswith(p))
                    for p in pair]
            current = next((int(k) for k, _, chosen in found if chosen), None)
            target = next((k for k in keys if k != current), None)
            if target is None:
                page.keyboard.press("Escape")  # the popover closes; nothing changed
                return False
            page.evaluate("window.__bench.arm()")
            options.and_(page.locator(f'[data-key="{target}"]')).click()
            return True

        return self._change(change, **done)

    def slider(self, label: str, keys: tuple[str, str], rep: int, where=None, **done):
        """A slider (or select_slider) labelled `label`: one press of keys[rep % 2] on its focused thumb."""
        page = self.page
        thumb = (where or page).locator('[data-testid="stSlider"]').filter(
            has=page.get_by_text(label, exact=True)).first.get_by_role("slider")

        def change():
            thumb.focus()
            page.evaluate("window.__bench.arm()")
            thumb.press(keys[rep % 2])

        return self._change(change, **done)

    def toggle(self, label: str, where=None, **done):
        page = self.page
        box = (where or page).locator('[data-testid="stCheckbox"]').filter(has=page.get_by_text(label, exact=True))

        def change():
            page.evaluate("window.__bench.arm()")
            box.first.locator("label").first.click()

        return self._change(change, **done)

    def text(self, label: str, value: str, **done):
        """Type `value` into the text box labelled `label` and press Enter (the change)."""
        page = self.page
        box = page.locator('[data-testid="stTextInput"]').filter(has=page.get_by_text(label, exact=True)).first

        def change():
            field = box.locator("input")
            field.fill(value)
            page.evaluate("window.__bench.arm()")
            field.press("Enter")

        return self._change(change, **done)

    def tab(self, name: str, text: str):
        """Click the tab `name`: done when its panel, holding `text`, shows (tabs switch in the browser alone)."""
        page = self.page

        def change():
            page.evaluate("window.__bench.arm()")
            page.get_by_role("tab", name=name).click()

        return self._change(change, rerun=False, text=text, selector='[role="tabpanel"]')

    def _change(self, change, **done) -> float:
        if change() is False:  # it arms itself just before the input that makes the change
            return 0.0
        seconds = self.wait_done(**done)
        if self.page.locator('[data-testid="stException"]').count():
            raise RuntimeError("the page shows an exception")
        return seconds
