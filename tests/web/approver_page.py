"""Drives warden-approver's web page in Debian's Chromium (never a downloaded browser) with
Playwright: log in with the operator token, see a request arrive live (SSE), read its diff,
approve it with the keyboard, see the outcome; then two more: move between them with j/k, see one
answered by another operator (the page shows who, and an answer sent anyway is refused with who
answered), deny the other with d, a typed reason and Enter. Edits (Claude Edit/MultiEdit/Write,
Codex changes and apply_patch) render as diffs and commands with their cwd. At a
phone's width and at a desktop's it checks what a person using a keyboard or a screen reader
needs: every control has a label, Tab follows the reading order, text contrast is at least
WCAG AA, nothing overflows sideways. Screenshots go to the artifacts directory.

Usage: approver_page.py URL TOKEN_FILE ARTIFACT_DIR EXPECTED_TEXT
Talks with the test over stdout/stdin, one word a line: prints READY once logged in (the test
then starts the first task), APPROVED after approving it (the test starts two more, second.txt
then third.txt), SHOWN once second.txt is on screen (the test answers it as another operator,
then writes ANSWERED), and DONE after denying third.txt; exits non-zero with a reason on any
failure. Nothing but the approver's own address may be loaded (no CDN).
"""
import os
import sys
import tempfile

from playwright.sync_api import expect, sync_playwright

url, token_file, artifacts, expected = sys.argv[1:5]
os.makedirs(artifacts, exist_ok=True)
token = open(token_file).read().split()[1]
profile = tempfile.mkdtemp(prefix="warden-chromium-")
PHONE = {"width": 390, "height": 844}

# Every visible control's accessible name (label, aria-label, aria-labelledby or text).
UNLABELLED = """() => [...document.querySelectorAll('input, textarea, select, button, summary, [tabindex]')]
  .filter((e) => e.offsetParent !== null)
  .filter((e) => {
    const byLabel = e.labels && [...e.labels].some((l) => l.textContent.trim());
    const byAria = (e.getAttribute('aria-label') || '').trim();
    const byRef = (e.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean)
      .some((id) => (document.getElementById(id) || {}).textContent);
    const byText = ['BUTTON', 'SUMMARY'].includes(e.tagName) && e.textContent.trim();
    return !(byLabel || byAria || byRef || byText);
  })
  .map((e) => e.outerHTML.slice(0, 120))"""

# WCAG 2.1 contrast of every visible text against the background it is painted on.
LOW_CONTRAST = """() => {
  const rgb = (s) => { const m = s.match(/[\\d.]+/g) || [0, 0, 0, 0]; return m.map(Number); };
  const lum = ([r, g, b]) => { const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const bg = (e) => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length < 4 || c[3] > 0) return c.slice(0, 3); } return [255, 255, 255]; };
  const bad = [];
  for (const e of document.querySelectorAll('body *')) {
    if (e.offsetParent === null && e.tagName !== 'BODY') continue;
    const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const st = getComputedStyle(e);
    const fg = rgb(st.color).slice(0, 3), back = bg(e);
    const [a, b] = [lum(fg), lum(back)].sort((x, y) => y - x);
    const ratio = (a + 0.05) / (b + 0.05);
    const size = parseFloat(st.fontSize), bold = parseInt(st.fontWeight, 10) >= 700;
    const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < need) bad.push(`${e.tagName}#${e.id}.${e.className} "${e.textContent.trim().slice(0, 40)}": ${ratio.toFixed(2)} < ${need}`);
  }
  return bad;
}"""

# Nothing wider than the viewport: no sideways scrolling on a phone.
OVERFLOW = """() => document.documentElement.scrollWidth - window.innerWidth"""


# The detail's rendering of each kind of raw input, as text.
RENDERINGS = """() => {
  const base = { root: '/r', locations: [], kind: 'edit', title: 't' };
  const text = (nodes) => nodes.map((n) => n.textContent).join('\\n');
  const of = (raw, extra) => text(rendered({ ...base, ...(extra || {}), raw_input: raw }));
  return {
    multi: of({ file_path: '/r/src/a.rs', edits: [{ old_string: 'let a = 1;', new_string: 'let a = 2;' },
                                                 { old_string: 'x', new_string: 'y' }] }),
    edit: of({ file_path: '/r/b.txt', old_string: 'old line\\nsame', new_string: 'new line\\nsame' }),
    write: of({ file_path: '/r/new.txt', content: 'first\\nsecond\\n' }),
    codex: of({ changes: { '/r/d.txt': { add: { content: 'hi\\n' } },
                           '/r/e.txt': { update: { unified_diff: '@@ -1 +1 @@\\n-old\\n+new' } } } }),
    patch: of({ command: ['apply_patch', '*** Begin Patch\\n*** Update File: c.py\\n-print(1)\\n+print(2)\\n*** End Patch'], cwd: '/r' }),
    command: of({ command: ['cargo', 'test', '--all'], cwd: '/r/sub' }, { kind: 'execute' }),
  };
}"""


def check_renderings(page):
    r = page.evaluate(RENDERINGS)
    want = {
        "multi": ["Edit 1 of src/a.rs", "- let a = 1;", "+ let a = 2;", "Edit 2 of src/a.rs", "- x", "+ y"],
        "edit": ["Edit b.txt", "- old line", "+ new line", "  same"],
        "write": ["Write new.txt (new content)", "+ first", "+ second"],
        "codex": ["Add d.txt", "+ hi", "Update e.txt", "- old", "+ new"],
        "patch": ["apply_patch", "*** Update File: c.py", "- print(1)", "+ print(2)", "cwd: /r"],
        "command": ["Command", "cargo test --all", "cwd: /r/sub"],
    }
    for kind, needles in want.items():
        for n in needles:
            assert n in r[kind], f"{kind} rendering lacks {n!r}:\n{r[kind]}"
    assert "- \n" not in r["write"], f"a new file has no removed line:\n{r['write']}"


def tab_order(page, n):
    """The first n elements Tab reaches from the top of the page: (tag, id or text)."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    page.locator("h1").click()
    seen = []
    for _ in range(n):
        page.keyboard.press("Tab")
        seen.append(page.evaluate(
            "() => { const e = document.activeElement; return [e.tagName, e.id || e.textContent.trim().slice(0, 30)]; }"))
    return seen


def accessible(page, where):
    """The page as it is now passes the label, contrast and width checks."""
    unlabelled = page.evaluate(UNLABELLED)
    assert not unlabelled, f"{where}: controls without a label: {unlabelled}"
    low = page.evaluate(LOW_CONTRAST)
    assert not low, f"{where}: text below WCAG AA contrast: {low}"
    over = page.evaluate(OVERFLOW)
    assert over <= 0, f"{where}: the page is {over}px wider than the viewport"


def say(word):
    print(word, flush=True)


def wait_for(word):
    line = sys.stdin.readline().strip()
    assert line == word, f"expected {word} from the test, got {line!r}"


with sync_playwright() as p:
    ctx = p.chromium.launch_persistent_context(
        profile,
        executable_path="/usr/bin/chromium",
        headless=True,
        args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
        ],
        viewport=PHONE,  # a phone's width
    )
    page = ctx.new_page()
    page.set_default_timeout(20000)
    loaded = []
    page.on("request", lambda r: loaded.append(r.url))
    page.goto(url)
    # The login form: labelled, the token field first in Tab order, then its button.
    expect(page.get_by_label("Operator token")).to_be_focused()
    accessible(page, "login")
    order = tab_order(page, 2)
    assert order == [["INPUT", "token"], ["BUTTON", "Log in"]], f"login tab order: {order}"
    # A wrong token is refused and says so.
    page.get_by_label("Operator token").fill("not-a-token")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown or expired operator token")
    page.get_by_label("Operator token").fill(token)
    page.keyboard.press("Enter")
    expect(page.get_by_text("signed in as operator")).to_be_visible()
    expect(page.get_by_text("Nothing waits for you.")).to_be_visible()
    accessible(page, "empty list")
    page.screenshot(path=os.path.join(artifacts, "1-logged-in.png"), full_page=True)
    say("READY")

    # The request arrives live, newest first, and its diff shows the new content.
    item = page.locator("#pending button.item").first
    expect(item).to_contain_text("edit", timeout=30000)
    expect(item).to_contain_text("conversation web1")
    expect(item).to_contain_text("page.txt")
    expect(page.locator("#detail pre.diff .add")).to_contain_text(expected)
    expect(page.locator("#detail")).to_contain_text("tool.escalate")
    # Readable: the diff is labelled, the path relative to the root.
    expect(page.get_by_role("heading", name="Write page.txt (new content)")).to_be_visible()
    check_renderings(page)
    accessible(page, "request at phone width")
    # Reading order for a keyboard: the list, then the detail's controls, reason before answers.
    order = tab_order(page, 5)
    names = [o[1] for o in order]
    assert names[0] == "logout", f"tab order: {order}"
    assert order[1][0] == "BUTTON" and "edit" in order[1][1], f"tab order: {order}"
    assert names[2:] == ["Raw input", "reason", "approve"], f"tab order: {order}"
    # Usable on a phone: the answer buttons are on screen width and big enough to touch.
    for b in ["#approve", "#deny"]:
        box = page.locator(b).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], f"{b}: {box}"
        assert box["height"] >= 44, f"{b} is {box['height']}px high"
    page.screenshot(path=os.path.join(artifacts, "2-request.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    accessible(page, "request at desktop width")
    page.screenshot(path=os.path.join(artifacts, "approver-page.png"), full_page=True)

    # Approve with the keyboard.
    page.locator("h1").click()
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(page.locator("#status")).to_contain_text("approved")
    expect(page.locator("#history")).to_contain_text("approved by web:operator")
    page.screenshot(path=os.path.join(artifacts, "3-approved.png"), full_page=True)
    say("APPROVED")

    # Two more, newest first; j and k move the selection between them.
    items = page.locator("#pending button.item")
    expect(items).to_have_count(2, timeout=30000)
    expect(items.nth(0)).to_contain_text("third.txt")
    expect(items.nth(1)).to_contain_text("second.txt")
    page.locator("h1").click()
    page.keyboard.press("k")
    expect(items.nth(0)).to_have_attribute("aria-current", "true")
    expect(page.locator("#detail-h")).to_contain_text("third.txt")
    page.keyboard.press("j")
    expect(items.nth(1)).to_have_attribute("aria-current", "true")
    expect(items.nth(0)).to_have_attribute("aria-current", "false")
    expect(page.locator("#detail-h")).to_contain_text("second.txt")
    second = items.nth(1).get_attribute("data-id")
    say("SHOWN")
    # Another operator answers second.txt first: the page shows who and how, live.
    wait_for("ANSWERED")
    expect(page.locator("#outcome")).to_contain_text("denied by uid:")
    expect(page.locator("#outcome")).to_contain_text("answered elsewhere")
    expect(page.locator("#history")).to_contain_text("answered elsewhere")
    # An answer sent anyway (a page that had not heard yet) is refused, naming who answered.
    late = page.evaluate(
        """async (id) => { const r = await fetch('/api/answer', { method: 'POST',
             headers: { 'content-type': 'application/json', 'x-warden': '1',
                        authorization: 'Bearer ' + sessionStorage.getItem('warden_session') },
             body: JSON.stringify({ id, verdict: 'approve', reason: '' }) });
           return [r.status, await r.json()]; }""", second)
    assert late[0] == 409, f"a late answer: {late}"
    assert "already decided" in late[1]["error"] and "answered elsewhere" in late[1]["error"], late
    assert late[1]["approval"]["state"] == "denied", late
    accessible(page, "answered elsewhere")
    page.screenshot(path=os.path.join(artifacts, "4-answered-elsewhere.png"), full_page=True)

    # third.txt is left: select it, d focuses the reason, Enter sends the denial.
    expect(items).to_have_count(1)
    page.locator("h1").click()
    page.keyboard.press("k")
    expect(page.locator("#detail-h")).to_contain_text("third.txt")
    page.keyboard.press("d")
    expect(page.locator("#reason")).to_be_focused()
    page.keyboard.type("typed in the browser")
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_contain_text("denied by web:operator: typed in the browser")
    expect(page.locator("#history")).to_contain_text("typed in the browser")
    page.screenshot(path=os.path.join(artifacts, "5-denied.png"), full_page=True)
    foreign = [u for u in loaded if not u.startswith(url.rstrip("/") + "/")]
    assert not foreign, f"the page loaded something from elsewhere: {foreign}"
    ctx.close()
say("DONE")
