#!/usr/bin/env python3
"""Two people chatting in two headless Chromium browsers, through the demo client.

    python3 two_browsers.py --api http://127.0.0.1:18080 --alice 101 --bob 102 \
        [--screenshot out.png]

Needs ingest-api in demo mode (serving /app/ and /demo/*), the gateway it points the
app at, and the pipeline's fanout and receipts processors. Use fresh user ids each run.

Steps and checks:
  1. both sign in; their connection state shows "online";
  2. alice opens a DIRECT chat with bob and sends a message; bob's inbox shows it within
     1 s of alice's send returning, with unread 1; bob opens it, his unread falls to 0;
  3. bob types (alice sees "is typing"), and replies; alice sees it within 1 s, and her
     first message shows "Read";
  4. bob goes back to the inbox; alice sends 3 more; each reaches bob's inbox within 1 s;
     bob's unread shows 3; he opens the conversation: all 3 shown, unread 0;
  5. bob reacts to alice's first message; alice, in the conversation, sees it on hers;
  6. alice goes back to the inbox; bob names her with the @ picker; her inbox shows the
     mention badge until she opens the conversation and reads it;
  7. alice goes back to the inbox; bob clicks "Reply" under alice's last message (the
     root), and sends a reply in the thread panel; alice's inbox shows the unread-threads
     badge (1); she opens the conversation: the reply is not in the main list, the root
     shows "1 reply" marked unread; she opens the thread panel and sees bob's reply; the
     marker and the badge clear, and stay clear once she is back on the inbox.

"Send returning" is when alice's page got the POST's answer: the app stamps each message
row with `data-shown-at` (ms since the epoch). Both browsers run on this machine, so the
latency is the moment this script saw the message in bob's page minus that stamp (an
upper bound: it includes the polling interval).

Prints one JSON line with the latencies and checks; exits 1 with the reason and both
browsers' console logs on any failure. --screenshot PATH writes one PNG with alice's
window (left) and bob's (right) side by side.
"""

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

# Never let Selenium Manager go online for a browser or driver: we name both.
os.environ.setdefault("SE_OFFLINE", "true")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,700",
]
LATENCY_LIMIT_MS = 1000
POLL_S = 0.02

# What the page shows, read in one round trip. Returns a plain object.
PAGE_STATE_JS = """
const conv = document.getElementById('conversation');
const text = (root, sel) => root.querySelector(sel)?.textContent ?? null;
return {
  connection: text(document, '[data-testid="connection-state"]'),
  openConversation: conv?.dataset.conversationId ? Number(conv.dataset.conversationId) : null,
  typing: text(document, '[data-testid="typing"]'),
  inbox: [...document.querySelectorAll('[data-testid="conversation-item"]')].map((row) => ({
    id: Number(row.dataset.conversationId),
    unread: text(row, '[data-testid="unread"]'),
    mentions: text(row, '[data-testid="mentions"]'),
    unreadThreads: text(row, '[data-testid="unread-threads"]'),
    preview: text(row, '.preview'),
  })),
  messages: [...document.querySelectorAll('[data-testid="message"]')].map((row) => ({
    seq: Number(row.dataset.seq),
    senderId: Number(row.dataset.senderId),
    shownAt: Number(row.dataset.shownAt),
    body: text(row, '[data-testid="message-body"]'),
    receipt: text(row, '[data-testid="receipt"]'),
    reactions: [...row.querySelectorAll('[data-testid="reaction"]')].map((b) => b.textContent),
    replies: text(row, '[data-testid="replies"]'),
    repliesUnread: row.querySelector('[data-testid="replies"]')?.dataset.unread === 'true',
  })),
  threadPanel: (() => {
    const panel = document.querySelector('[data-testid="thread-panel"]');
    if (!panel || panel.hidden) return null;
    return {
      rootSeq: Number(panel.dataset.rootSeq),
      messages: [...panel.querySelectorAll('[data-testid="thread-message"]')].map((row) => ({
        seq: Number(row.dataset.seq),
        senderId: Number(row.dataset.senderId),
        body: text(row, '[data-testid="message-body"]'),
      })),
    };
  })(),
};
"""


class Failure(Exception):
    """A check that did not hold."""


def now_ms():
    return time.time() * 1000


class Browser:
    """One headless Chromium, signed in (later) as one user."""

    def __init__(self, name, api):
        self.name = name
        self.api = api.rstrip("/")
        self.profile = tempfile.mkdtemp(prefix=f"chatpipe-{name}-")
        self.console = []
        options = Options()
        options.binary_location = CHROMIUM
        for arg in CHROMIUM_ARGS:
            options.add_argument(arg)
        options.add_argument(f"--user-data-dir={self.profile}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)

    def state(self):
        return self.driver.execute_script(PAGE_STATE_JS)

    def wait_for(self, what, predicate, timeout_s):
        """Polls the page until predicate(state) is truthy; returns (value, seen_at_ms)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while True:
            last = self.state()
            value = predicate(last)
            if value:
                return value, now_ms()
            if time.monotonic() >= deadline:
                raise Failure(f"{self.name}: {what}: not within {timeout_s} s; the page shows {json.dumps(last)}")
            time.sleep(POLL_S)

    def find(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def click(self, css):
        # The inbox is redrawn on every change: retry if the element was replaced.
        for _ in range(20):
            try:
                self.find(css).click()
                return
            except StaleElementReferenceException:
                time.sleep(POLL_S)
        raise Failure(f"{self.name}: could not click {css}")

    def type(self, testid, text):
        field = self.find(f'[data-testid="{testid}"]')
        field.clear()
        field.send_keys(text)

    def sign_in(self, user_id):
        self.driver.get(f"{self.api}/app/")
        self.type("login-user", str(user_id))
        self.click('[data-testid="login-submit"]')

    def collect_console(self):
        try:
            self.console.extend(self.driver.get_log("browser"))
        except WebDriverException:
            pass
        return self.console

    def screenshot_b64(self):
        return self.driver.get_screenshot_as_base64()

    def close(self):
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


# ---- predicates over a page state ----

def row(state, conversation_id):
    return next((r for r in state["inbox"] if r["id"] == conversation_id), None)


def unread_of(state, conversation_id):
    r = row(state, conversation_id)
    if r is None:
        return None
    return int(r["unread"]) if (r["unread"] or "").strip() else 0


def unread_threads_of(state, conversation_id):
    """The inbox row's unread-threads badge ("🧵 1") as a number; 0 when empty or absent."""
    r = row(state, conversation_id)
    if r is None:
        return None
    digits = "".join(ch for ch in (r.get("unreadThreads") or "") if ch.isdigit())
    return int(digits) if digits else 0


def message_with(state, body):
    return next((m for m in state["messages"] if m["body"] == body), None)


def message_at(state, seq):
    return next((m for m in state["messages"] if m["seq"] == seq), None)


def thread_reply_with(state, body):
    """A reply shown in the open thread panel, by body."""
    panel = state.get("threadPanel") or {}
    return next((m for m in panel.get("messages", []) if m["body"] == body), None)


# ---- the scenario ----

def send(browser, text):
    """Sends from the open conversation; returns the committed message row (with shownAt)."""
    browser.type("composer", text)
    browser.click('[data-testid="send"]')
    msg, _ = browser.wait_for(f"own message {text!r} committed (has a seq)", lambda s: message_with(s, text), 10)
    return msg


def run(args, alice, bob, report):
    checks = report["checks"]
    latency = report["latenciesMs"]
    tag = uuid.uuid4().hex[:6]

    # 1. Both sign in and go online.
    alice.sign_in(args.alice)
    bob.sign_in(args.bob)
    for b in (alice, bob):
        b.wait_for("connection state 'online'", lambda s: s["connection"] == "online", 20)
    checks["bothOnline"] = True

    # 2. Alice opens a DIRECT chat with bob and sends.
    alice.type("new-direct-peer", str(args.bob))
    alice.click('[data-testid="new-direct-submit"]')
    conv_id, _ = alice.wait_for("the direct conversation opens", lambda s: s["openConversation"], 10)
    report["conversationId"] = conv_id

    first = f"Hi bob, it's alice ({tag})"
    sent = send(alice, first)
    _, seen = bob.wait_for(
        "alice's first message in bob's inbox",
        lambda s: (row(s, conv_id) or {}).get("preview") == first,
        5,
    )
    latency["aliceToBob"] = round(seen - sent["shownAt"])
    if latency["aliceToBob"] > LATENCY_LIMIT_MS:
        raise Failure(f"bob saw alice's message {latency['aliceToBob']} ms after her send returned (limit {LATENCY_LIMIT_MS})")
    bob.wait_for("bob's unread badge shows 1", lambda s: unread_of(s, conv_id) == 1, 3)
    checks["bobUnread1BeforeOpening"] = True

    bob.click(f'[data-testid="conversation-item"][data-conversation-id="{conv_id}"] a')
    bob.wait_for("alice's message in bob's open conversation", lambda s: s["openConversation"] == conv_id and message_with(s, first), 5)
    bob.wait_for("bob's unread back to 0 after opening", lambda s: unread_of(s, conv_id) == 0, 3)
    checks["bobUnread0AfterOpening"] = True
    bob_read_at = now_ms()

    # 3. Bob types (alice sees it) and replies.
    reply = f"Hello alice, bob here ({tag})"
    started = now_ms()
    bob.type("composer", reply)
    _, seen = alice.wait_for("alice sees 'is typing'", lambda s: "is typing" in (s["typing"] or ""), 5)
    latency["typing"] = round(seen - started)
    checks["aliceSawTyping"] = True
    bob.click('[data-testid="send"]')
    sent, _ = bob.wait_for("bob's reply committed", lambda s: message_with(s, reply), 10)
    state, seen = alice.wait_for("bob's reply in alice's conversation", lambda s: message_with(s, reply) and s, 5)
    latency["bobToAlice"] = round(seen - sent["shownAt"])
    if latency["bobToAlice"] > LATENCY_LIMIT_MS:
        raise Failure(f"alice saw bob's reply {latency['bobToAlice']} ms after his send returned (limit {LATENCY_LIMIT_MS})")
    checks["typingClearedByMessage"] = not (state["typing"] or "")
    if not checks["typingClearedByMessage"]:
        raise Failure(f"alice still shows {state['typing']!r} after bob's message arrived")

    # Reads are applied by the receipts processor within its window (about 1 s), so
    # this one has no 1 s limit.
    _, seen = alice.wait_for(
        "alice's first message shows Read",
        lambda s: "Read" in ((message_with(s, first) or {}).get("receipt") or ""),
        10,
    )
    latency["readTickAfterBobRead"] = round(seen - bob_read_at)
    checks["aliceSawRead"] = True

    # 4. Bob back on the inbox; alice sends 3 more.
    bob.click('[data-testid="close-conversation"]')
    bob.wait_for("bob back on the inbox", lambda s: s["openConversation"] is None, 3)
    latency["aliceToBobInbox"] = []
    for i in range(1, 4):
        text = f"more #{i} ({tag})"
        sent = send(alice, text)
        _, seen = bob.wait_for(
            f"alice's message {i} in bob's inbox",
            lambda s, text=text: (row(s, conv_id) or {}).get("preview") == text,
            5,
        )
        latency["aliceToBobInbox"].append(round(seen - sent["shownAt"]))
    slow = [ms for ms in latency["aliceToBobInbox"] if ms > LATENCY_LIMIT_MS]
    if slow:
        raise Failure(f"bob's inbox showed alice's messages after {latency['aliceToBobInbox']} ms (limit {LATENCY_LIMIT_MS})")
    bob.wait_for("bob's unread shows 3", lambda s: unread_of(s, conv_id) == 3, 3)
    checks["bobUnread3WhileAway"] = True

    bob.click(f'[data-testid="conversation-item"][data-conversation-id="{conv_id}"] a')
    bob.wait_for(
        "the 3 messages in bob's open conversation",
        lambda s: s["openConversation"] == conv_id and all(message_with(s, f"more #{i} ({tag})") for i in (1, 2, 3)),
        5,
    )
    bob.wait_for("bob's unread back to 0", lambda s: unread_of(s, conv_id) == 0, 3)
    checks["bobUnread0AfterReopening"] = True

    # 5. Bob reacts to alice's first message (the "+" and its first choice, a thumbs up);
    # alice, who has the conversation open, sees it on her message.
    first_seq = message_with(bob.state(), first)["seq"]
    on_first = f'[data-testid="message"][data-seq="{first_seq}"]'
    bob.click(f'{on_first} [data-testid="react"]')
    bob.click(f'{on_first} [data-testid="reaction-choice"]')
    bob.wait_for("bob's reaction on his side", lambda s: "👍 1" in (message_with(s, first) or {}).get("reactions", []), 5)
    started = now_ms()
    _, seen = alice.wait_for(
        "bob's reaction on alice's message",
        lambda s: "👍 1" in ((message_with(s, first) or {}).get("reactions") or []),
        5,
    )
    latency["reactionToAlice"] = round(seen - started)
    checks["aliceSawReaction"] = True

    # 6. Alice back on her inbox; bob names her with the @ picker; her inbox shows the
    # mention until she opens the conversation and reads it.
    alice.click('[data-testid="close-conversation"]')
    alice.wait_for("alice back on the inbox", lambda s: s["openConversation"] is None, 3)
    bob.type("composer", "look @")
    bob.click('[data-testid="mention-choice"]')
    bob.click('[data-testid="send"]')
    alice.wait_for("the mention badge in alice's inbox", lambda s: ((row(s, conv_id) or {}).get("mentions") or "").startswith("@"), 5)
    checks["aliceSawMention"] = True
    alice.click(f'[data-testid="conversation-item"][data-conversation-id="{conv_id}"] a')
    alice.wait_for("alice's mention badge clears once she reads", lambda s: not (row(s, conv_id) or {}).get("mentions"), 5)
    checks["aliceMentionClearedByReading"] = True

    # 7. A thread: alice back on her inbox; bob replies under her last message; she sees
    # the thread badge, then the root's "1 reply" marked unread, then the reply in the
    # thread panel; reading it clears both.
    thread_replies(alice, bob, conv_id, tag, checks)


def thread_replies(alice, bob, conv_id, tag, checks):
    """Step 7: bob replies in the thread of alice's last message (bob has the conversation open)."""
    root_body = f"more #3 ({tag})"
    alice.click('[data-testid="close-conversation"]')
    alice.wait_for("alice back on the inbox", lambda s: s["openConversation"] is None, 3)

    root_seq = message_with(bob.state(), root_body)["seq"]
    bob.click(f'[data-testid="message"][data-seq="{root_seq}"] [data-testid="reply"]')
    bob.wait_for("bob's thread panel opens on the root", lambda s: (s["threadPanel"] or {}).get("rootSeq") == root_seq, 5)
    reply = f"a reply in the thread, bob ({tag})"
    bob.type("thread-input", reply)
    bob.click('[data-testid="thread-send"]')
    bob.wait_for("bob's reply committed in his thread panel", lambda s: thread_reply_with(s, reply), 10)

    alice.wait_for("the unread-threads badge (1) in alice's inbox", lambda s: unread_threads_of(s, conv_id) == 1, 5)
    alice.click(f'[data-testid="conversation-item"][data-conversation-id="{conv_id}"] a')
    state, _ = alice.wait_for(
        "the root shows '1 reply', marked unread, in alice's conversation",
        lambda s: s["openConversation"] == conv_id
        and "1 reply" in ((message_at(s, root_seq) or {}).get("replies") or "")
        and (message_at(s, root_seq) or {}).get("repliesUnread")
        and s,
        5,
    )
    checks["aliceSawUnreadThread"] = True
    if message_with(state, reply):
        raise Failure("bob's reply shows in alice's main message list, not only in its thread")

    alice.click(f'[data-testid="message"][data-seq="{root_seq}"] [data-testid="replies"]')
    alice.wait_for(
        "bob's reply in alice's thread panel",
        lambda s: (s["threadPanel"] or {}).get("rootSeq") == root_seq and thread_reply_with(s, reply),
        5,
    )
    checks["aliceSawThreadReply"] = True

    alice.wait_for(
        "the root's unread marker and alice's thread badge clear once she reads the thread",
        lambda s: not (message_at(s, root_seq) or {}).get("repliesUnread") and unread_threads_of(s, conv_id) == 0,
        5,
    )
    alice.click('[data-testid="close-thread"]')
    alice.click('[data-testid="close-conversation"]')
    alice.wait_for("alice back on the inbox", lambda s: s["openConversation"] is None, 3)
    # Any inbox reload after the read must agree: give one a moment to land.
    time.sleep(0.5)
    alice.wait_for("no thread badge in alice's inbox after reading", lambda s: unread_threads_of(s, conv_id) == 0, 5)
    checks["aliceThreadClearedByReading"] = True


def side_by_side(left, right, path):
    """Writes one PNG of both windows side by side, drawn by `left`'s browser."""
    images = [left.screenshot_b64(), right.screenshot_b64()]
    page = tempfile.NamedTemporaryFile("w", suffix=".html", delete=False)
    with page:
        page.write(
            "<!doctype html><body style='margin:0;display:flex;gap:8px;background:#888'>"
            + "".join(f"<img src='data:image/png;base64,{b64}'>" for b64 in images)
            + "</body>"
        )
    try:
        left.driver.get(f"file://{page.name}")
        width, height = left.driver.execute_script(
            "return [document.body.scrollWidth, Math.max(...[...document.images].map(i => i.naturalHeight))]"
        )
        # Size the window so that its viewport (smaller than the window) fits the images.
        inner_w, inner_h = left.driver.execute_script("return [innerWidth, innerHeight]")
        outer = left.driver.get_window_size()
        left.driver.set_window_size(width + outer["width"] - inner_w, height + outer["height"] - inner_h)
        left.driver.save_screenshot(path)
    finally:
        os.unlink(page.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True, help="ingest-api base URL, e.g. http://127.0.0.1:18080")
    parser.add_argument("--alice", required=True, type=int, help="alice's user id (fresh each run)")
    parser.add_argument("--bob", required=True, type=int, help="bob's user id (fresh each run)")
    parser.add_argument("--screenshot", help="write a PNG of both windows here (alice left, bob right)")
    args = parser.parse_args()
    if args.alice == args.bob:
        parser.error("alice and bob need different user ids")

    report = {"ok": False, "alice": args.alice, "bob": args.bob, "latenciesMs": {}, "checks": {}}
    browsers = []
    error = None
    try:
        alice = Browser("alice", args.api)
        browsers.append(alice)
        bob = Browser("bob", args.api)
        browsers.append(bob)
        run(args, alice, bob, report)
        report["ok"] = True
    except Failure as exc:
        error = str(exc)
    except Exception as exc:  # a crash of the script or the browser is a failure too
        error = f"{type(exc).__name__}: {exc}"

    if error:
        report["error"] = error
        print(f"FAILED: {error}", file=sys.stderr)
        for b in browsers:
            print(f"--- {b.name}'s browser console ---", file=sys.stderr)
            for entry in b.collect_console():
                print(f"  [{entry.get('level')}] {entry.get('message')}", file=sys.stderr)
    if args.screenshot and len(browsers) == 2:
        try:
            side_by_side(browsers[0], browsers[1], args.screenshot)
            report["screenshot"] = args.screenshot
        except Exception as exc:
            print(f"screenshot failed: {exc}", file=sys.stderr)
    for b in browsers:
        b.close()

    print(json.dumps(report))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
