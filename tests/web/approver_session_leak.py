"""Issue 31, case 3: does the approver's session travel to another server on the same host?

Usage: approver_session_leak.py APPROVER_URL TOKEN_FILE OTHER_URL
Logs in on the approver's page in Debian's Chromium (never a downloaded browser), then, in the
same browser, opens OTHER_URL: another port on 127.0.0.1, served by another local user (the test
starts it). Prints `SESSION <secret>` (what the page holds) and `VISITED` once the other page
loaded; exits non-zero with a reason on any failure.
"""
import sys
import tempfile

from playwright.sync_api import expect, sync_playwright

url, token_file, other = sys.argv[1:4]
token = open(token_file).read().split()[1]
profile = tempfile.mkdtemp(prefix="warden-chromium-")

with sync_playwright() as p:
    ctx = p.chromium.launch_persistent_context(
        profile,
        executable_path="/usr/bin/chromium",
        headless=True,
        args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
        ],
    )
    page = ctx.new_page()
    page.set_default_timeout(20000)
    page.goto(url)
    page.get_by_label("Operator token").fill(token)
    page.keyboard.press("Enter")
    expect(page.get_by_text("signed in as operator")).to_be_visible()
    secret = page.evaluate("sessionStorage.getItem('warden_session') || ''")
    print(f"SESSION {secret}", flush=True)
    # The operator opens another local page: in a new tab, and in the same tab.
    other_tab = ctx.new_page()
    other_tab.goto(other)
    page.goto(other)
    print("VISITED", flush=True)
    ctx.close()
