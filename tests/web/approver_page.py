"""Drives warden-approver's web page in Debian's Chromium (never a downloaded browser) with
Playwright: log in with the operator token, see a request arrive live (SSE), read its diff,
approve it with the keyboard, and see the outcome. Screenshots go to the artifacts directory.

Usage: approver_page.py URL TOKEN_FILE ARTIFACT_DIR EXPECTED_TEXT
Prints READY once logged in (the test then starts the task) and DONE at the end; exits non-zero
with a reason on any failure.
"""
import os
import sys
import tempfile

from playwright.sync_api import expect, sync_playwright

url, token_file, artifacts, expected = sys.argv[1:5]
os.makedirs(artifacts, exist_ok=True)
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
        viewport={"width": 390, "height": 844},  # a phone's width
    )
    page = ctx.new_page()
    page.set_default_timeout(20000)
    page.goto(url)
    # A wrong token is refused and says so.
    page.get_by_label("Operator token").fill("not-a-token")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown or expired operator token")
    page.get_by_label("Operator token").fill(token)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_text("signed in as operator")).to_be_visible()
    expect(page.get_by_text("Nothing waits for you.")).to_be_visible()
    page.screenshot(path=os.path.join(artifacts, "1-logged-in.png"), full_page=True)
    print("READY", flush=True)

    # The request arrives live, newest first, and its diff shows the new content.
    item = page.locator("#pending button.item").first
    expect(item).to_contain_text("edit", timeout=30000)
    expect(page.locator("#detail pre.diff .add")).to_contain_text(expected)
    expect(page.locator("#detail")).to_contain_text("tool.escalate")
    page.screenshot(path=os.path.join(artifacts, "2-request.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.screenshot(path=os.path.join(artifacts, "approver-page.png"), full_page=True)

    # Approve with the keyboard.
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("j")
    page.keyboard.press("a")
    expect(page.locator("#status")).to_contain_text("approved")
    expect(page.locator("#history")).to_contain_text("approved")
    expect(page.locator("#history")).to_contain_text("web:operator")
    page.screenshot(path=os.path.join(artifacts, "3-approved.png"), full_page=True)
    ctx.close()
print("DONE", flush=True)
