// chatpipe browser client: state and rendering (vanilla DOM, no framework).
//
// How it fits together:
//   - state         everything the page shows, in plain objects and Maps
//   - catch-up      REST loads (/sync, /inbox, history) merged into state
//   - pushes        WebSocket frames (docs/protocol.md) merged into state
//   - actions       what the user does: sign in, open, send, edit, delete, …
//   - replies       a message's thread in the thread panel (threadRootSeq, docs/api.md "Threads")
//   - rendering     render() redraws from state (batched: once per task)
//
// Server data is always merged, never trusted blindly over newer pushes: see
// mergeConversation() and upsertMessage().
//
// Words: a "thread" here is the message store of one conversation (state.threads), as
// before threads existed in the API. A message's own thread is its "replies": a reply
// names its "root" (threadRootSeq); the root's `thread` field is the API's summary of
// its replies; the thread panel shows one root and its replies.

import { Api, ApiError, Gateway, demoConfig } from './api.js';

// ---------------------------------------------------------------------------
// Tunables
// ---------------------------------------------------------------------------

/** Send a typing frame at most this often while the user types (protocol.md: 1–2 s). */
const TYPING_SEND_EVERY_MS = 2000;
/** Show "X is typing…" until this long after their last typing frame (protocol.md). */
const TYPING_SHOW_MS = 6000;
/** Ticks are fetched for this many of your newest messages in the open conversation. */
const RECEIPTS_TRACKED = 10;
/** The inbox preview is the first 120 characters, as the API's. */
const PREVIEW_CHARS = 120;
/**
 * After a `resync` the gateway has renewed its presence, and fanout may take a moment to
 * read it (protocol.md): a second catch-up this long after the first picks up that moment.
 */
const SECOND_CATCH_UP_MS = 2000;
/**
 * A new socket catches up on its `ready` frame; if that has not come this long after the
 * connection (no fanout member running), it catches up without it (protocol.md).
 */
const READY_WAIT_MS = 5000;
/** The reactions the "+" button offers (any emoji or short name works over the API). */
const QUICK_REACTIONS = ['👍', '❤️', '😂', '🎉', '😮', '🙏'];

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

const state = {
  me: null, // the signed-in user id
  api: null, // Api for that user
  gateway: null, // Gateway (WebSocket)
  connection: { state: 'offline', detail: '' },
  readyWait: null, // the timer that catches up if a new socket's `ready` does not come

  /** conversationId -> the inbox row's data (as GET /inbox shows it). */
  conversations: new Map(),
  inboxCursor: null, // nextCursor of /inbox: more pages to load
  syncCursor: null, // nextCursor of the last /sync: where the next catch-up starts

  /** conversationId -> Thread: the messages held for a conversation opened before. */
  threads: new Map(),
  openId: null, // the conversation on screen

  /** `${conversationId}:${userId}` -> timer that hides "is typing". */
  typing: new Map(),
  /** The message whose reaction choices are shown, if any. */
  reactingTo: null,
  /** conversationId -> its members' ids, for the @ picker (loaded when opened). */
  members: new Map(),
  /**
   * The thread panel, if open: { conversationId, rootSeq, loaded, readSentSeq }
   * (`readSentSeq`: the newest reply a thread read was sent for).
   */
  threadPanel: null,
  lastTypingSentAt: 0,
};

function newThread() {
  return {
    // seq -> { seq, senderId, body, createdAt, editedAt, deleted, shownAt, threadRootSeq?, thread? }:
    // every seq, replies included (the main list hides them; the thread panel shows them).
    messages: new Map(),
    pending: [], // your sends without an answer yet: { clientMsgId, body, failed }
    pendingReplies: [], // your replies without an answer yet: { clientMsgId, body, rootSeq, failed }
    receipts: new Map(), // seq -> receipts answer, for your own messages
    earlyChanges: new Map(), // seq -> an edit/delete that came before its message
    loaded: false,
    hasOlder: false,
    filling: false,
    version: 0, // bumped on every change, so the message list redraws only when needed
  };
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

/** Builds an element: el('li', { class: 'x', dataset: { seq: 1 } }, 'text', child). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key === 'class') node.className = value;
    else node.setAttribute(key, value === true ? '' : value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

const userName = (id) => (id === state.me ? 'You' : `User ${id}`);

function conversationTitle(conv) {
  if (conv.type === 'DIRECT') return conv.peerId ? `User ${conv.peerId}` : 'Direct chat';
  return conv.title || `Group ${conv.conversationId}`;
}

function formatTime(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  const sameDay = date.toDateString() === new Date().toDateString();
  return sameDay
    ? date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
    : date.toLocaleDateString([], { month: 'short', day: 'numeric' });
}

/** crypto.randomUUID needs a secure context (https or localhost); fall back elsewhere. */
function newClientMsgId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function showError(err) {
  console.error(err);
  const toast = $('toast');
  toast.textContent = err instanceof Error ? err.message : String(err);
  toast.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => (toast.hidden = true), 6000);
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// ---------------------------------------------------------------------------
// Merging server data into state
// ---------------------------------------------------------------------------

/**
 * Merges a conversation as the API shows it (inbox row, sync entry, create answer)
 * into state. A REST answer can be older than pushes already applied (it was read
 * before they were committed), so counts are only taken when the answer is at least
 * as new (`lastSeq`), and the read watermark only moves forwards.
 */
function mergeConversation(server, { fromInbox = false } = {}) {
  const id = server.conversationId;
  const local = state.conversations.get(id);
  if (!local) {
    state.conversations.set(id, {
      conversationId: id,
      type: server.type,
      title: server.title,
      peerId: server.peerId,
      memberCount: server.memberCount,
      lastSeq: server.lastSeq ?? 0,
      lastReadSeq: server.lastReadSeq ?? 0,
      unreadCount: server.unreadCount ?? 0,
      mentionCount: server.mentionCount ?? 0,
      unreadThreads: server.unreadThreads ?? 0,
      notificationLevel: server.notificationLevel ?? 'all',
      mutedUntil: server.mutedUntil,
      lastActivityAt: server.lastActivityAt || server.createdAt,
      lastMessage: server.lastMessage || null,
    });
    return;
  }
  for (const key of ['type', 'title', 'peerId', 'memberCount', 'notificationLevel']) {
    if (server[key] !== undefined) local[key] = server[key];
  }
  if (server.notificationLevel !== undefined) local.mutedUntil = server.mutedUntil;
  const serverRead = server.lastReadSeq ?? 0;
  const readSeq = Math.max(local.lastReadSeq, serverRead);
  if (server.lastSeq >= local.lastSeq && server.unreadCount !== undefined) {
    local.lastSeq = server.lastSeq;
    local.lastActivityAt = server.lastActivityAt || local.lastActivityAt;
    if (fromInbox) local.lastMessage = server.lastMessage || null;
    // We may have read further than the server has applied yet (stream mode applies
    // reads within a second): then estimate from our own watermark.
    local.unreadCount =
      serverRead >= readSeq
        ? server.unreadCount
        : Math.min(server.unreadCount, Math.max(0, server.lastSeq - readSeq));
    if (server.unreadThreads !== undefined) {
      local.unreadThreads = server.unreadThreads;
      if (local.unreadThreads === 0) clearUnreadRoots(id);
    }
  } else if (readSeq > local.lastReadSeq) {
    local.unreadCount = Math.min(local.unreadCount, Math.max(0, local.lastSeq - readSeq));
  }
  // Mentions count as the server counts them, unless we have read everything since.
  if (server.mentionCount !== undefined) local.mentionCount = server.mentionCount;
  if (readSeq >= local.lastSeq) local.mentionCount = 0;
  local.lastReadSeq = readSeq;
}

function toLastMessage(m) {
  return m.deleted
    ? { seq: m.seq, senderId: m.senderId, deleted: true, createdAt: m.createdAt }
    : { seq: m.seq, senderId: m.senderId, preview: m.body.slice(0, PREVIEW_CHARS), createdAt: m.createdAt };
}

/**
 * Adds or updates a message held in `thread` (from history, sync, a push or a send's
 * answer). Deduped by seq; a deleted message stays deleted; an edited body is never
 * replaced by an older one.
 */
function upsertMessage(thread, incoming) {
  const seq = incoming.seq;
  let msg = thread.messages.get(seq);
  const created = !msg;
  if (created) {
    msg = { seq, senderId: incoming.senderId, createdAt: incoming.createdAt, shownAt: Date.now() };
    thread.messages.set(seq, msg);
  }
  msg.senderId ??= incoming.senderId;
  msg.createdAt ??= incoming.createdAt;
  msg.threadRootSeq ??= incoming.threadRootSeq ?? undefined;
  // History, sync and answers show a message as it is now (no reactions or mentions:
  // none); pushes (with a `type`) say what changed and are applied where they land.
  if (incoming.type === undefined) {
    msg.reactions = incoming.reactions ?? [];
    msg.mentions = incoming.mentions ?? [];
    if (incoming.thread) mergeRepliesSummary(msg, incoming.thread);
  } else if (incoming.mentions) {
    msg.mentions = incoming.mentions;
  }
  if (!msg.deleted) {
    if (incoming.deleted) {
      markDeleted(msg);
    } else if (incoming.body !== undefined && !isOlderEdit(incoming.editedAt, msg.editedAt, msg.body)) {
      msg.body = incoming.body;
      msg.editedAt = incoming.editedAt || msg.editedAt;
    }
  }
  if (created && msg.threadRootSeq !== undefined) countReply(thread, msg);
  const early = thread.earlyChanges.get(seq);
  if (early) {
    thread.earlyChanges.delete(seq);
    applyChange(thread, early);
  }
  thread.version++;
}

/** Whether a body stamped `incomingEditedAt` is older than the one held. */
function isOlderEdit(incomingEditedAt, heldEditedAt, heldBody) {
  if (heldBody === undefined || !heldEditedAt) return false;
  if (!incomingEditedAt) return true; // the original body, but we hold an edit
  return Date.parse(incomingEditedAt) < Date.parse(heldEditedAt);
}

function markDeleted(msg) {
  msg.deleted = true;
  delete msg.body;
  delete msg.editedAt;
  msg.reactions = [];
  msg.mentions = [];
}

/** Applies an edit or delete ({seq, body, editedAt} or {seq, deleted}) to a held message. */
function applyChange(thread, change) {
  const msg = thread.messages.get(change.seq);
  if (!msg) {
    // Not held yet: keep it for when the message arrives (a delete beats an edit).
    const kept = thread.earlyChanges.get(change.seq);
    if (!kept?.deleted) thread.earlyChanges.set(change.seq, change);
    return;
  }
  if (msg.deleted) return;
  if (change.deleted) {
    if (msg.threadRootSeq !== undefined) uncountReply(thread, msg);
    markDeleted(msg);
  } else if (!isOlderEdit(change.editedAt, msg.editedAt, msg.body)) {
    msg.body = change.body;
    msg.editedAt = change.editedAt;
    if (change.mentions) msg.mentions = change.mentions;
  }
  thread.version++;
}

// ---------------------------------------------------------------------------
// Replies: a root's `thread` summary (docs/api.md, history and "Threads")
// ---------------------------------------------------------------------------

/** A summary for a root the server showed none for yet (its author follows from the first reply). */
function emptyRepliesSummary(root) {
  return { replyCount: 0, lastReplySeq: 0, repliers: [], following: root.senderId === state.me, unread: false, countedThrough: 0 };
}

/**
 * Merges a root's summary as the server shows it (history, sync's `threads`). An answer
 * older than the replies already counted (`lastReplySeq`) keeps the counts held; the
 * read position only moves forwards. `countedThrough`: the replies up to that seq are in
 * the server's `replyCount`, so countReply() skips them.
 */
function mergeRepliesSummary(root, server) {
  const held = root.thread;
  const lastReadSeq = Math.max(held?.lastReadSeq ?? 0, server.lastReadSeq ?? 0);
  if (!held || server.lastReplySeq >= held.lastReplySeq) {
    const { rootSeq, ...summary } = server; // a sync entry names its root
    root.thread = { ...summary, repliers: [...(server.repliers ?? [])], lastReadSeq, countedThrough: server.lastReplySeq };
  } else {
    held.lastReadSeq = lastReadSeq;
  }
  if (root.thread.lastReadSeq >= root.thread.lastReplySeq) root.thread.unread = false;
}

/** A reply new to the store: counts it in its root's summary, unless the server's count has it. */
function countReply(thread, reply) {
  const root = thread.messages.get(reply.threadRootSeq);
  if (!root) return; // older than what is held: its summary comes with it
  const summary = (root.thread ??= emptyRepliesSummary(root));
  if (reply.seq <= (summary.countedThrough ?? 0)) return;
  summary.lastReplySeq = Math.max(summary.lastReplySeq, reply.seq);
  if (reply.deleted) return;
  summary.replyCount += 1;
  summary.lastReplyAt = reply.createdAt ?? summary.lastReplyAt;
  if (summary.repliers.length < 3 && !summary.repliers.includes(reply.senderId)) summary.repliers.push(reply.senderId);
  if (reply.senderId === state.me) {
    // Replying follows the thread, and reads it up to the reply.
    summary.following = true;
    summary.lastReadSeq = Math.max(summary.lastReadSeq ?? 0, reply.seq);
    if (summary.lastReadSeq >= summary.lastReplySeq) summary.unread = false;
  } else if (summary.following && reply.seq > (summary.lastReadSeq ?? 0)) {
    summary.unread = true;
  }
}

/** A held reply was deleted: one reply fewer on its root. */
function uncountReply(thread, reply) {
  const summary = thread.messages.get(reply.threadRootSeq)?.thread;
  if (summary) summary.replyCount = Math.max(0, summary.replyCount - 1);
}

/**
 * The caller's place in a thread moved (a thread read, follow or unfollow: its answer, or
 * a `thread.read` frame): `{lastReadSeq, following}`.
 */
function applyRootPlace(conversationId, rootSeq, place) {
  const thread = state.threads.get(conversationId);
  const root = thread?.messages.get(rootSeq);
  if (!root) return;
  const summary = (root.thread ??= emptyRepliesSummary(root));
  summary.lastReadSeq = Math.max(summary.lastReadSeq ?? 0, place.lastReadSeq ?? 0);
  if (typeof place.following === 'boolean') summary.following = place.following;
  if (!summary.following || summary.lastReadSeq >= summary.lastReplySeq) summary.unread = false;
  thread.version++;
}

/** No followed thread of the conversation is unread (`unreadThreads` is 0): unmark its roots. */
function clearUnreadRoots(conversationId) {
  const thread = state.threads.get(conversationId);
  if (!thread) return;
  for (const msg of thread.messages.values()) {
    if (msg.thread?.unread) {
      msg.thread.unread = false;
      thread.version++;
    }
  }
}

/** The replies held for root `rootSeq`, ascending. */
function repliesOf(thread, rootSeq) {
  return sortedSeqs(thread)
    .map((seq) => thread.messages.get(seq))
    .filter((m) => m.threadRootSeq === rootSeq);
}

/** rootSeq -> how many replies (not deleted) the store holds for it. */
function heldReplyCounts(thread) {
  const counts = new Map();
  for (const m of thread.messages.values()) {
    if (m.threadRootSeq !== undefined && !m.deleted) counts.set(m.threadRootSeq, (counts.get(m.threadRootSeq) ?? 0) + 1);
  }
  return counts;
}

function sortedSeqs(thread) {
  return [...thread.messages.keys()].sort((a, b) => a - b);
}

/** The highest seq up to which the thread holds every message (from its oldest). */
function contiguousTop(thread) {
  const seqs = sortedSeqs(thread);
  if (seqs.length === 0) return 0;
  let top = seqs[0];
  for (const seq of seqs) {
    if (seq > top + 1) break;
    top = seq;
  }
  return top;
}

function maxSeq(thread) {
  let max = 0;
  for (const seq of thread.messages.keys()) max = Math.max(max, seq);
  return max;
}

// ---------------------------------------------------------------------------
// Catch-up over REST (docs/protocol.md, "After any disconnect")
// ---------------------------------------------------------------------------

let catchUpChain = Promise.resolve();

/** Queues a catch-up; catch-ups run one at a time, so the sync cursors form one chain. */
function catchUp() {
  catchUpChain = catchUpChain.then(runCatchUp).catch(showError);
  return catchUpChain;
}

async function runCatchUp() {
  if (!state.api) return;
  if (!state.syncCursor) {
    // First load: a cursor first (changes after it come in the next sync), then the
    // inbox, which has the previews a sync entry lacks.
    const first = await state.api.sync();
    state.syncCursor = first.nextCursor;
    await loadInbox();
    return;
  }
  const page = await state.api.sync(state.syncCursor);
  if (page.conversations.length) console.info(`[chatpipe] catch-up: ${page.conversations.length} changed`);
  for (const entry of page.conversations) applySyncEntry(entry);
  state.syncCursor = page.nextCursor;
  render();
}

function applySyncEntry(entry) {
  const id = entry.conversationId;
  if (entry.left) {
    state.conversations.delete(id);
    state.threads.delete(id);
    if (state.threadPanel?.conversationId === id) state.threadPanel = null;
    if (state.openId === id) location.hash = '#/';
    return;
  }
  mergeConversation(entry);
  const conv = state.conversations.get(id);
  const newest = entry.messages.at(-1);
  if (newest && newest.seq === conv.lastSeq) conv.lastMessage = toLastMessage(newest);

  const thread = state.threads.get(id);
  if (thread) {
    if (entry.hasMore) {
      // More changed than the entry holds: start this conversation's history afresh.
      state.threads.delete(id);
      if (state.threadPanel?.conversationId === id) state.threadPanel = null;
      if (state.openId === id) openConversation(id);
    } else {
      for (const m of entry.messages) upsertMessage(thread, m);
      applySyncedRoots(thread, entry.threads ?? []);
      if (contiguousTop(thread) < maxSeq(thread)) fillGap(id);
    }
  }
  if (entry.messages.some((m) => m.senderId !== state.me)) ack(id, conv.lastSeq);
  if (id === state.openId) markReadIfVisible();
}

/** A sync entry's `threads`: the summaries (and the caller's places) of roots that changed. */
function applySyncedRoots(thread, changed) {
  for (const summary of changed) {
    const root = thread.messages.get(summary.rootSeq);
    if (root) mergeRepliesSummary(root, summary);
  }
  if (changed.length > 0) thread.version++;
}

async function loadInbox({ more = false } = {}) {
  const page = await state.api.inbox(more ? state.inboxCursor : undefined);
  for (const conv of page.conversations) mergeConversation(conv, { fromInbox: true });
  state.inboxCursor = page.nextCursor || null;
  render();
}

const refreshInboxSoon = debounce(() => loadInbox().catch(showError), 150);

/** Loads the newest page of a conversation's history. */
async function loadThread(id) {
  const thread = threadFor(id);
  const page = await state.api.history(id);
  for (const m of page.messages) upsertMessage(thread, m);
  thread.hasOlder = page.hasMore;
  thread.loaded = true;
  const conv = state.conversations.get(id);
  if (conv) conv.lastSeq = Math.max(conv.lastSeq, page.lastSeq);
  // Something newer may have come while this page was read: fill up to it.
  if (contiguousTop(thread) < maxSeq(thread)) await fillGap(id);
}

/** Fetches what is missing after the highest contiguous seq held (`afterSeq`). */
async function fillGap(id) {
  const thread = state.threads.get(id);
  if (!thread || thread.filling) return;
  thread.filling = true;
  try {
    let after = contiguousTop(thread);
    for (;;) {
      const page = await state.api.history(id, { afterSeq: after, limit: 200 });
      for (const m of page.messages) upsertMessage(thread, m);
      if (!page.hasMore || page.messages.length === 0) break;
      after = page.messages.at(-1).seq;
    }
  } catch (err) {
    showError(err);
  } finally {
    thread.filling = false;
  }
  render();
  if (id === state.openId) markReadIfVisible();
}

function threadFor(id) {
  let thread = state.threads.get(id);
  if (!thread) {
    thread = newThread();
    state.threads.set(id, thread);
  }
  return thread;
}

// ---------------------------------------------------------------------------
// Pushes (docs/protocol.md, "Frames")
// ---------------------------------------------------------------------------

function onFrame(frame) {
  console.debug('[chatpipe] push', JSON.stringify(frame));
  switch (frame.type) {
    case 'message.new':
      onMessageNew(frame);
      break;
    case 'message.edited':
    case 'message.deleted':
      onMessageChanged(frame);
      break;
    case 'read.updated':
      onReadUpdated(frame);
      break;
    case 'delivery.updated':
      if (frame.conversationId === state.openId) refreshReceiptsSoon();
      break;
    case 'typing':
      onTyping(frame);
      break;
    case 'reaction.added':
    case 'reaction.removed':
      onReaction(frame);
      break;
    case 'mention':
      refreshInboxSoon(); // a large group's message names us: its push was light
      break;
    case 'thread.read':
      onThreadRead(frame);
      break;
    case 'ready':
      // This socket's pushes are live: whatever came before is in the REST API.
      clearTimeout(state.readyWait);
      catchUp();
      break;
    case 'resync':
      // Pushes may have been lost while this socket stayed open (a broker outage).
      catchUp();
      setTimeout(catchUp, SECOND_CATCH_UP_MS);
      break;
    default:
    // Unknown frame types may come in later versions: ignore them.
  }
  render();
}

function onMessageNew(frame) {
  const id = frame.conversationId;
  const mine = frame.senderId === state.me;
  const conv = state.conversations.get(id);
  const reply = frame.threadRootSeq !== undefined && frame.threadRootSeq !== null;

  if (!conv) {
    refreshInboxSoon(); // a conversation someone just started with us
  } else if (frame.light) {
    refreshInboxSoon(); // a large group: the push says only where to look
  } else if (frame.seq > conv.lastSeq) {
    conv.lastSeq = frame.seq;
    conv.lastActivityAt = frame.createdAt || new Date().toISOString();
    conv.lastMessage = toLastMessage(frame);
    if (mine) {
      conv.lastReadSeq = frame.seq; // sending reads everything before it
      conv.unreadCount = 0;
    } else {
      if (!reply) conv.unreadCount += 1; // replies count in their thread (unreadThreads)
      if ((frame.mentions ?? []).includes(state.me)) conv.mentionCount = (conv.mentionCount ?? 0) + 1;
    }
  }

  const thread = state.threads.get(id);
  if (thread?.loaded) {
    if (!frame.light) upsertMessage(thread, frame);
    if (frame.light || contiguousTop(thread) < maxSeq(thread)) fillGap(id);
  }
  // A reply: stored like any message (above), shown in its thread. Unless that thread is
  // on screen (then it is read at once, below), the inbox says whether it is unread.
  if (reply && !mine && !threadOnScreen(id, frame.threadRootSeq)) refreshInboxSoon();
  if (!mine && frame.senderId) stopTyping(id, frame.senderId);
  if (!mine) ack(id, frame.seq);
  if (id === state.openId) {
    markReadIfVisible();
    // A send moves its sender's read watermark with it, and no read.updated comes for
    // that: someone else's message means they read ours before it.
    if (!mine) refreshReceiptsSoon();
  }
}

function onMessageChanged(frame) {
  const id = frame.conversationId;
  const deleted = frame.type === 'message.deleted';
  const conv = state.conversations.get(id);
  if (conv?.lastMessage?.seq === frame.seq) {
    if (deleted) conv.lastMessage = { ...conv.lastMessage, deleted: true, preview: undefined };
    else if (!frame.light) conv.lastMessage.preview = frame.body.slice(0, PREVIEW_CHARS);
  }
  // Unread counts skip deleted messages: let the server recount.
  if (deleted && conv && frame.seq > conv.lastReadSeq) refreshInboxSoon();

  const thread = state.threads.get(id);
  if (!thread?.loaded) return;
  if (deleted) applyChange(thread, { seq: frame.seq, deleted: true });
  else if (!frame.light) {
    applyChange(thread, { seq: frame.seq, body: frame.body, editedAt: frame.editedAt, mentions: frame.mentions });
  }
  else if (thread.messages.has(frame.seq)) refetchMessage(id, frame.seq);
}

/**
 * A reaction changed: `count` is the key's count now (not a delta). The reactor's own
 * devices learn "me" from `userId`; light frames (large groups) carry no `userId`.
 */
function onReaction(frame) {
  const msg = state.threads.get(frame.conversationId)?.messages.get(frame.seq);
  if (!msg || msg.deleted) return;
  const reactions = msg.reactions ?? [];
  let entry = reactions.find((r) => r.key === frame.key);
  if (!entry) {
    entry = { key: frame.key, count: 0, me: false };
    reactions.push(entry);
  }
  entry.count = frame.count;
  if (frame.userId === state.me) entry.me = frame.type === 'reaction.added';
  msg.reactions = reactions.filter((r) => r.count > 0);
  state.threads.get(frame.conversationId).version++;
  if (frame.conversationId === state.openId) refreshInboxSoon();
}

/** Adds the caller's reaction `key` to message `seq` of the open conversation, or takes it back. */
async function toggleReaction(seq, key) {
  const id = state.openId;
  const thread = state.threads.get(id);
  const msg = thread?.messages.get(seq);
  if (!msg || msg.deleted) return;
  const mine = (msg.reactions ?? []).some((r) => r.key === key && r.me);
  state.reactingTo = null;
  const answer = await state.api.react(id, seq, key, mine);
  msg.reactions = answer.reactions;
  thread.version++;
  render();
}

async function refetchMessage(id, seq) {
  try {
    const page = await state.api.history(id, { afterSeq: seq - 1, limit: 1 });
    const thread = state.threads.get(id);
    if (thread) for (const m of page.messages) upsertMessage(thread, m);
    render();
  } catch (err) {
    showError(err);
  }
}

function onReadUpdated(frame) {
  const id = frame.conversationId;
  if (frame.userId === state.me) {
    // We read on another device (or this one's read came back): move our watermark.
    const conv = state.conversations.get(id);
    if (conv && frame.lastReadSeq > conv.lastReadSeq) {
      conv.lastReadSeq = frame.lastReadSeq;
      if (conv.lastReadSeq >= conv.lastSeq) conv.unreadCount = 0;
      else refreshInboxSoon();
    }
  } else if (id === state.openId) {
    refreshReceiptsSoon(); // someone else read: update "read by"
  }
}

/** Our place in a thread moved on another device of ours (a thread read, follow or unfollow). */
function onThreadRead(frame) {
  if (frame.rootSeq !== undefined && frame.rootSeq !== null) applyRootPlace(frame.conversationId, frame.rootSeq, frame);
  refreshInboxSoon(); // unreadThreads
}

function onTyping(frame) {
  if (frame.userId === state.me) return;
  const key = `${frame.conversationId}:${frame.userId}`;
  clearTimeout(state.typing.get(key));
  state.typing.set(
    key,
    setTimeout(() => {
      state.typing.delete(key);
      render();
    }, TYPING_SHOW_MS),
  );
}

function stopTyping(conversationId, userId) {
  const key = `${conversationId}:${userId}`;
  clearTimeout(state.typing.get(key));
  state.typing.delete(key);
}

/** Delivered tick: "this device got every message up to seq" (cumulative). */
function ack(conversationId, seq) {
  state.gateway?.send({ type: 'ack', conversationId, seq });
}

// ---------------------------------------------------------------------------
// Read marks and receipts
// ---------------------------------------------------------------------------

/** Marks what the open conversation shows as read, if the page is visible. */
function markReadIfVisible() {
  markThreadReadIfVisible();
  const id = state.openId;
  const conv = state.conversations.get(id);
  const thread = state.threads.get(id);
  if (!conv || !thread?.loaded || document.visibilityState !== 'visible') return;
  const seq = maxSeq(thread);
  if (seq === 0 || seq <= conv.lastReadSeq) return;
  conv.lastReadSeq = seq;
  conv.unreadCount = seq >= conv.lastSeq ? 0 : Math.min(conv.unreadCount, conv.lastSeq - seq);
  if (seq >= conv.lastSeq) conv.mentionCount = 0;
  render();
  state.api.markRead(id, seq).catch(showError);
}

function emptyReceipt(conv) {
  return conv.type === 'DIRECT'
    ? { read: false, delivered: false }
    : { readBy: 0, deliveredTo: 0, memberCount: conv.memberCount };
}

function isFinalReceipt(r) {
  return r.read === true || (r.memberCount !== undefined && r.readBy >= r.memberCount - 1);
}

/** Your newest own messages in a thread (not deleted), newest first. */
function ownRecentSeqs(thread) {
  return sortedSeqs(thread)
    .reverse()
    .filter((seq) => {
      const m = thread.messages.get(seq);
      return m.senderId === state.me && !m.deleted && m.threadRootSeq === undefined;
    })
    .slice(0, RECEIPTS_TRACKED);
}

/** Refreshes the receipts of your recent messages in the open conversation. */
async function refreshReceipts() {
  const id = state.openId;
  const thread = state.threads.get(id);
  if (!thread) return;
  const stale = ownRecentSeqs(thread).filter((seq) => {
    const r = thread.receipts.get(seq);
    return !r || !isFinalReceipt(r);
  });
  await Promise.all(
    stale.map((seq) =>
      state.api
        .receipts(id, seq)
        .then((r) => thread.receipts.set(seq, r))
        .catch(() => {}), // a tick is not worth a toast
    ),
  );
  thread.version++;
  render();
}

const refreshReceiptsSoon = debounce(refreshReceipts, 250);

/** Combines two receipts of the same conversation into the most advanced. */
function bestReceipt(a, b) {
  if (!a) return b;
  if (!b) return a;
  if (a.read !== undefined) return { read: a.read || b.read, delivered: a.delivered || b.delivered };
  return {
    readBy: Math.max(a.readBy, b.readBy),
    deliveredTo: Math.max(a.deliveredTo, b.deliveredTo),
    memberCount: a.memberCount,
  };
}

function receiptLabel(r) {
  if (!r) return { text: '✓', cls: 'sent', title: 'Sent' };
  if (r.read !== undefined) {
    if (r.read) return { text: '✓✓ Read', cls: 'read', title: 'Read' };
    if (r.delivered) return { text: '✓✓', cls: 'delivered', title: 'Delivered' };
    return { text: '✓', cls: 'sent', title: 'Sent' };
  }
  if (r.readBy > 0) return { text: `✓✓ read by ${r.readBy}`, cls: 'read', title: `Read by ${r.readBy}` };
  if (r.deliveredTo > 0) return { text: '✓✓', cls: 'delivered', title: `Delivered to ${r.deliveredTo}` };
  return { text: '✓', cls: 'sent', title: 'Sent' };
}

// ---------------------------------------------------------------------------
// Actions
// ---------------------------------------------------------------------------

async function signIn(userId) {
  const api = new Api(userId);
  await api.renewToken();
  const config = await demoConfig();

  state.me = userId;
  state.api = api;
  sessionStorage.setItem('chatpipe.user', String(userId));
  $('login-screen').hidden = true;
  $('chat-screen').hidden = false;
  $('sign-out').hidden = false;
  render();

  catchUp(); // the inbox
  state.gateway = new Gateway(config.gatewayUrl, api, {
    onFrame,
    onState: (connection, detail = '') => {
      console.info(`[chatpipe] connection ${connection}${detail ? `: ${detail}` : ''}`);
      state.connection = { state: connection, detail };
      render();
    },
    // A new socket catches up once, on its `ready` frame (docs/protocol.md); if none
    // comes in READY_WAIT_MS (no fanout running), once without it, and again on `ready`.
    onOpen: () => {
      clearTimeout(state.readyWait);
      state.readyWait = setTimeout(catchUp, READY_WAIT_MS);
    },
  });
  state.gateway.start();
  route();
}

function signOut() {
  state.gateway?.stop();
  sessionStorage.removeItem('chatpipe.user');
  // The simplest complete reset: reload without ?user= or #conversation.
  location.replace(location.pathname);
}

async function openConversation(id) {
  state.openId = id;
  if (state.threadPanel?.conversationId !== id) state.threadPanel = null;
  state.lastTypingSentAt = 0;
  scrollMode = 'bottom';
  render();
  const thread = threadFor(id);
  try {
    if (!thread.loaded) await loadThread(id);
    else await fillGap(id);
    if (!state.conversations.has(id)) await loadInbox();
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      state.threads.delete(id);
      location.hash = '#/';
    }
    showError(err);
    return;
  }
  if (state.openId !== id) return;
  scrollMode = 'bottom';
  render();
  markReadIfVisible();
  refreshReceipts();
  state.api
    .members(id)
    .then((list) => state.members.set(id, list.members.map((m) => m.userId)))
    .catch(() => {}); // the picker stays empty; sending works without it
}

function closeConversation() {
  state.openId = null;
  state.threadPanel = null;
  render();
}

/** The address bar holds the open conversation: #/c/<id>, or #/ for the inbox. */
function route() {
  if (!state.me) return;
  const match = location.hash.match(/^#\/c\/(\d+)$/);
  const id = match ? Number(match[1]) : null;
  if (id === state.openId) return;
  if (id) openConversation(id);
  else closeConversation();
}

async function startDirect(peerId) {
  const conv = await state.api.openDirect(peerId);
  if (!state.conversations.has(conv.conversationId)) {
    mergeConversation(conv);
    if (conv.lastSeq > 0) refreshInboxSoon(); // it existed: the inbox has its counts
  }
  location.hash = `#/c/${conv.conversationId}`;
}

async function createGroup(title, memberIds) {
  const conv = await state.api.createGroup(title, memberIds);
  mergeConversation({ ...conv, lastReadSeq: 0, unreadCount: 0 });
  location.hash = `#/c/${conv.conversationId}`;
}

async function loadOlder() {
  const id = state.openId;
  const thread = state.threads.get(id);
  if (!thread || thread.messages.size === 0) return;
  const page = await state.api.history(id, { beforeSeq: sortedSeqs(thread)[0] });
  for (const m of page.messages) upsertMessage(thread, m);
  thread.hasOlder = page.hasMore;
  scrollMode = 'keep';
  render();
}

function sendMessage(text) {
  const id = state.openId;
  const thread = threadFor(id);
  const pending = { clientMsgId: newClientMsgId(), body: text, mentions: mentionsIn(text), failed: false };
  thread.pending.push(pending);
  thread.version++;
  scrollMode = 'bottom';
  render();
  deliver(id, thread, pending);
}

/** Sends a pending message; "Retry" calls this again with the same clientMsgId. */
async function deliver(id, thread, pending) {
  pending.failed = false;
  thread.version++;
  render();
  try {
    const answer = await state.api.send(id, pending.clientMsgId, pending.body, pending.mentions);
    thread.pending = thread.pending.filter((p) => p !== pending);
    upsertMessage(thread, {
      seq: answer.seq,
      senderId: state.me,
      body: pending.body,
      createdAt: answer.createdAt,
      mentions: pending.mentions,
    });
    const conv = state.conversations.get(id);
    if (conv && !thread.receipts.has(answer.seq)) thread.receipts.set(answer.seq, emptyReceipt(conv));
    noteOwnSend(id, answer, pending.body);
  } catch (err) {
    pending.failed = true;
    thread.version++;
    showError(err);
  }
  render();
}

/** A send of ours committed: it reads everything before it, and may be the newest message. */
function noteOwnSend(id, answer, body) {
  const conv = state.conversations.get(id);
  if (!conv) return;
  conv.lastReadSeq = Math.max(conv.lastReadSeq, answer.seq);
  if (answer.seq >= conv.lastSeq) {
    conv.lastSeq = answer.seq;
    conv.unreadCount = 0;
    conv.lastActivityAt = answer.createdAt;
    conv.lastMessage = toLastMessage({ ...answer, body });
  }
}

async function editMessage(seq) {
  const msg = state.threads.get(state.openId)?.messages.get(seq);
  if (!msg || msg.deleted) return;
  const body = prompt('Edit message', msg.body);
  if (body === null || body.trim() === '' || body === msg.body) return;
  const answer = await state.api.editMessage(state.openId, seq, body);
  applyChange(state.threads.get(answer.conversationId), answer);
  render();
}

async function deleteMessage(seq) {
  if (!confirm('Delete this message for everyone?')) return;
  const id = state.openId;
  await state.api.deleteMessage(id, seq);
  const thread = state.threads.get(id);
  if (thread) applyChange(thread, { seq, deleted: true });
  render();
}

/** The members a text names: `@<id>` of a member of the open conversation, not oneself. */
function mentionsIn(text) {
  const members = new Set(state.members.get(state.openId) ?? []);
  const ids = [...text.matchAll(/@(\d+)\b/g)].map((m) => Number(m[1]));
  return [...new Set(ids)].filter((id) => members.has(id) && id !== state.me).sort((a, b) => a - b);
}

/** The @ picker: after "@" and any digits at the caret, the members whose id matches. */
function renderMentionPicker() {
  const composer = $('composer');
  const picker = $('mention-picker');
  const before = composer.value.slice(0, composer.selectionStart);
  const typed = before.match(/@(\d*)$/);
  const members = (state.members.get(state.openId) ?? []).filter((id) => id !== state.me);
  const matches = typed ? members.filter((id) => String(id).startsWith(typed[1])).slice(0, 8) : [];
  picker.hidden = matches.length === 0;
  picker.replaceChildren(
    ...matches.map((id) =>
      el('li', {}, el('button', { type: 'button', class: 'link', dataset: { mention: id, testid: 'mention-choice' } }, `@${id} ${userName(id)}`)),
    ),
  );
}

function pickMention(id) {
  const composer = $('composer');
  const at = composer.selectionStart;
  const before = composer.value.slice(0, at).replace(/@(\d*)$/, `@${id} `);
  composer.value = before + composer.value.slice(at);
  composer.focus();
  composer.selectionStart = composer.selectionEnd = before.length;
  renderMentionPicker();
}

async function toggleMute() {
  const id = state.openId;
  const conv = state.conversations.get(id);
  if (!conv) return;
  const level = conv.notificationLevel === 'none' ? 'all' : 'none';
  const answer = await state.api.setNotifications(id, level);
  conv.notificationLevel = answer.level;
  conv.mutedUntil = answer.mutedUntil;
  render();
}

function onComposerInput() {
  renderMentionPicker();
  sendTyping($('composer').value);
}

/** A typing frame for the open conversation (at most every TYPING_SEND_EVERY_MS), while `text` is not blank. */
function sendTyping(text) {
  const id = state.openId;
  const now = Date.now();
  if (!id || text.trim() === '') return;
  if (now - state.lastTypingSentAt < TYPING_SEND_EVERY_MS) return;
  if (state.gateway?.send({ type: 'typing', conversationId: id })) state.lastTypingSentAt = now;
}

// ---------------------------------------------------------------------------
// Replies: the thread panel
// ---------------------------------------------------------------------------

/** Whether the thread panel shows root `rootSeq` of conversation `id` on a visible page. */
function threadOnScreen(id, rootSeq) {
  const panel = state.threadPanel;
  return (
    panel?.conversationId === id && panel.rootSeq === rootSeq && id === state.openId && document.visibilityState === 'visible'
  );
}

/** Opens the thread panel on a top-level message of the open conversation ("Reply", "N replies"). */
async function openThreadPanel(rootSeq) {
  const id = state.openId;
  const root = state.threads.get(id)?.messages.get(rootSeq);
  if (!root || root.threadRootSeq !== undefined) return;
  state.threadPanel = { conversationId: id, rootSeq, loaded: false, readSentSeq: 0 };
  threadPanelScroll = 'bottom';
  render();
  queueMicrotask(() => $('thread-input').focus()); // after the render shows the panel
  try {
    await loadReplies(id, rootSeq);
  } finally {
    // Loaded, or failed: either way the panel shows (and reads) the replies held.
    const panel = state.threadPanel;
    if (panel?.conversationId === id && panel.rootSeq === rootSeq) {
      panel.loaded = true;
      threadPanelScroll = 'bottom';
      render();
      markThreadReadIfVisible();
    }
  }
}

function closeThreadPanel() {
  state.threadPanel = null;
  render();
}

/** Loads a thread's replies into the conversation's store (deduped by seq, as any message). */
async function loadReplies(id, rootSeq) {
  let after = 0;
  for (;;) {
    const page = await state.api.threadReplies(id, rootSeq, after);
    const thread = state.threads.get(id);
    // Only into a store that holds the root: every reply is then within, or after, what
    // it holds, so the gap logic stays as it was.
    if (!thread?.messages.has(rootSeq)) return;
    for (const m of page.messages) upsertMessage(thread, { ...m, threadRootSeq: m.threadRootSeq ?? rootSeq });
    if (contiguousTop(thread) < maxSeq(thread)) fillGap(id);
    if (!page.hasMore || page.messages.length === 0) return;
    after = page.messages.at(-1).seq;
  }
}

/** Marks the thread on screen read up to its newest reply held, once per newer reply. */
function markThreadReadIfVisible() {
  const panel = state.threadPanel;
  if (!panel?.loaded || !threadOnScreen(panel.conversationId, panel.rootSeq)) return;
  const thread = state.threads.get(panel.conversationId);
  const seq = thread ? (repliesOf(thread, panel.rootSeq).at(-1)?.seq ?? 0) : 0;
  if (seq === 0 || seq <= panel.readSentSeq) return;
  panel.readSentSeq = seq;
  readThread(panel.conversationId, panel.rootSeq, seq).catch(showError);
}

/** `POST …/threads/{rootSeq}/read`: the root shows read, the inbox the answer's unreadThreads. */
async function readThread(id, rootSeq, seq) {
  const answer = await state.api.readThread(id, rootSeq, seq);
  applyRootPlace(id, rootSeq, answer);
  const root = state.threads.get(id)?.messages.get(rootSeq);
  if (root?.thread) root.thread.unread = false; // read up to the newest reply shown
  applyUnreadThreads(id, answer.unreadThreads);
  render();
  // An inbox answer read before this one could still land: let a fresh one be the last.
  refreshInboxSoon();
}

function applyUnreadThreads(id, count) {
  const conv = state.conversations.get(id);
  if (!conv || count === undefined) return;
  conv.unreadThreads = count;
  if (count === 0) clearUnreadRoots(id);
}

/** Follows the thread on screen, or stops following it. */
async function toggleFollow() {
  const panel = state.threadPanel;
  const root = panel && state.threads.get(panel.conversationId)?.messages.get(panel.rootSeq);
  if (!root) return;
  const answer = await state.api.followThread(panel.conversationId, panel.rootSeq, !root.thread?.following);
  applyRootPlace(panel.conversationId, panel.rootSeq, answer);
  applyUnreadThreads(panel.conversationId, answer.unreadThreads);
  render();
}

/** Sends a reply in the thread on screen (with the @ mentions it names, as the composer). */
function sendReply(text) {
  const panel = state.threadPanel;
  if (!panel) return;
  const thread = threadFor(panel.conversationId);
  const pending = { clientMsgId: newClientMsgId(), body: text, mentions: mentionsIn(text), rootSeq: panel.rootSeq, failed: false };
  thread.pendingReplies.push(pending);
  threadPanelScroll = 'bottom';
  deliverReply(panel.conversationId, thread, pending);
}

/** Sends a pending reply; "Retry" calls this again with the same clientMsgId. */
async function deliverReply(id, thread, pending) {
  pending.failed = false;
  thread.version++;
  render();
  try {
    const answer = await state.api.send(id, pending.clientMsgId, pending.body, pending.mentions, pending.rootSeq);
    thread.pendingReplies = thread.pendingReplies.filter((p) => p !== pending);
    // New to the store: upsertMessage counts it on its root (once, whoever comes first:
    // this answer or the message.new push).
    upsertMessage(thread, {
      seq: answer.seq,
      senderId: state.me,
      body: pending.body,
      createdAt: answer.createdAt,
      mentions: pending.mentions,
      threadRootSeq: pending.rootSeq,
    });
    noteOwnSend(id, answer, pending.body);
  } catch (err) {
    pending.failed = true;
    thread.version++;
    showError(err);
  }
  render();
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

let renderQueued = false;
let renderedThreadKey = null;
/** What the next message-list redraw does to the scroll position: 'bottom' | 'keep' | null. */
let scrollMode = null;
let renderedPanelKey = null;
/** The same for the thread panel's replies: 'bottom' | null. */
let threadPanelScroll = null;

/** Redraws once at the end of the current task, however many changes it made. */
function render() {
  if (renderQueued) return;
  renderQueued = true;
  queueMicrotask(() => {
    renderQueued = false;
    renderTopbar();
    renderInbox();
    renderConversation();
    renderThreadPanel();
  });
}

function renderTopbar() {
  $('whoami').textContent = state.me ? `Signed in as User ${state.me}` : '';
  const conn = $('connection');
  conn.textContent = state.me ? state.connection.state : 'offline';
  conn.dataset.state = state.connection.state;
  conn.title = state.connection.detail || '';
}

function renderInbox() {
  const conversations = [...state.conversations.values()].sort(
    (a, b) => Date.parse(b.lastActivityAt || 0) - Date.parse(a.lastActivityAt || 0) || b.conversationId - a.conversationId,
  );
  $('inbox').replaceChildren(...conversations.map(inboxRow));
  $('inbox-empty').hidden = conversations.length > 0;
  $('inbox-more').hidden = !state.inboxCursor;
}

function inboxRow(conv) {
  const last = conv.lastMessage;
  let preview;
  if (!last) preview = el('span', { class: 'preview muted' }, 'No messages yet');
  else if (last.deleted) preview = el('span', { class: 'preview muted' }, 'message deleted');
  else preview = el('span', { class: 'preview' }, `${last.senderId === state.me ? 'You: ' : ''}${last.preview ?? ''}`);
  const unread = conv.unreadCount > 0 ? String(conv.unreadCount) : '';
  const mentioned = conv.mentionCount > 0 ? `@${conv.mentionCount > 1 ? conv.mentionCount : ''}` : '';
  const threads = conv.unreadThreads > 0 ? `🧵 ${conv.unreadThreads}` : '';
  const muted = conv.notificationLevel === 'none' || Date.parse(conv.mutedUntil ?? 0) > Date.now();
  const title = conversationTitle(conv);

  return el(
    'li',
    {
      class: `conversation-item${conv.conversationId === state.openId ? ' active' : ''}${unread ? ' has-unread' : ''}`,
      dataset: { testid: 'conversation-item', conversationId: conv.conversationId },
    },
    el(
      'a',
      { href: `#/c/${conv.conversationId}` },
      el('span', { class: `avatar ${conv.type === 'GROUP' ? 'group' : ''}`, 'aria-hidden': 'true' }, avatarText(conv, title)),
      el(
        'span',
        { class: 'row-main' },
        el('span', { class: 'row-line' }, el('span', { class: 'title' }, title), el('time', {}, formatTime(conv.lastActivityAt))),
        el(
          'span',
          { class: 'row-line' },
          preview,
          muted ? el('span', { class: 'muted-mark', title: 'muted', dataset: { testid: 'muted' } }, '🔕') : null,
          el('span', { class: 'badge mention', dataset: { testid: 'mentions' } }, mentioned),
          el('span', { class: 'badge threads', title: 'Threads with unread replies', dataset: { testid: 'unread-threads' } }, threads),
          el('span', { class: 'badge', dataset: { testid: 'unread' } }, unread),
        ),
      ),
    ),
  );
}

/** A group's initial, or the last two digits of a person's id. */
function avatarText(conv, title) {
  if (conv.type === 'GROUP') return title.trim().charAt(0).toUpperCase() || 'G';
  return String(conv.peerId ?? '').slice(-2);
}

function renderConversation() {
  const id = state.openId;
  document.body.classList.toggle('conversation-open', Boolean(id));
  $('conversation-empty').hidden = Boolean(id);
  $('conversation-view').hidden = !id;
  if (!id) {
    renderedThreadKey = null;
    delete $('conversation').dataset.conversationId;
    return;
  }
  const conv = state.conversations.get(id);
  const thread = threadFor(id);
  $('conversation').dataset.conversationId = id;
  $('conversation-title').textContent = conv ? conversationTitle(conv) : `Conversation ${id}`;
  $('conversation-subtitle').textContent = !conv
    ? ''
    : conv.type === 'DIRECT'
      ? 'Direct chat'
      : `Group · ${conv.memberCount} members`;
  $('load-older').hidden = !thread.hasOlder;
  $('mute').textContent = conv?.notificationLevel === 'none' ? 'Unmute' : 'Mute';
  $('typing').textContent = typingLine(id);

  const key = `${id}:${thread.version}`;
  if (key !== renderedThreadKey) {
    renderedThreadKey = key;
    renderMessages(conv, thread);
  }
}

function typingLine(conversationId) {
  const names = [...state.typing.keys()]
    .filter((key) => key.startsWith(`${conversationId}:`))
    .map((key) => userName(Number(key.split(':')[1])));
  if (names.length === 0) return '';
  if (names.length === 1) return `${names[0]} is typing…`;
  return `${names.slice(0, -1).join(', ')} and ${names.at(-1)} are typing…`;
}

function renderMessages(conv, thread) {
  const scroller = $('messages-scroll');
  const fromBottom = scroller.scrollHeight - scroller.scrollTop;
  const atBottom = fromBottom - scroller.clientHeight < 40;

  // Ticks: a receipt of a later message of yours is a lower bound for earlier ones
  // (watermarks), so walk newest to oldest carrying the best receipt seen.
  const seqs = sortedSeqs(thread);
  const ticks = new Map();
  let best = null;
  for (const seq of [...seqs].reverse()) {
    const msg = thread.messages.get(seq);
    if (msg.senderId !== state.me || msg.deleted) continue;
    best = bestReceipt(best, thread.receipts.get(seq));
    ticks.set(seq, best);
  }

  // Replies are held with every seq (gaps, ticks) but shown in their thread panel.
  const isGroup = conv?.type === 'GROUP';
  const heldReplies = heldReplyCounts(thread);
  const rows = seqs
    .filter((seq) => thread.messages.get(seq).threadRootSeq === undefined)
    .map((seq) => messageRow(thread.messages.get(seq), isGroup, ticks.get(seq), heldReplies.get(seq) ?? 0));
  const pendingRows = thread.pending.map(pendingRow);
  $('messages').replaceChildren(...rows, ...pendingRows);

  if (scrollMode === 'keep') scroller.scrollTop = scroller.scrollHeight - fromBottom;
  else if (scrollMode === 'bottom' || atBottom) scroller.scrollTop = scroller.scrollHeight;
  scrollMode = null;
}

function messageRow(msg, isGroup, receipt, heldReplies = 0) {
  const mine = msg.senderId === state.me;
  const meta = el('div', { class: 'meta' }, el('time', { datetime: msg.createdAt }, formatTime(msg.createdAt)));
  if (msg.editedAt && !msg.deleted) meta.append(el('span', { class: 'edited' }, 'edited'));
  if (mine && !msg.deleted) {
    const tick = receiptLabel(receipt);
    meta.append(
      el('span', { class: `status ${tick.cls}`, title: tick.title, dataset: { testid: 'receipt' } }, tick.text),
      el('button', { type: 'button', class: 'link action', dataset: { action: 'edit', seq: msg.seq } }, 'Edit'),
      el('button', { type: 'button', class: 'link action', dataset: { action: 'delete', seq: msg.seq } }, 'Delete'),
    );
  }
  return el(
    'li',
    {
      class: `message ${mine ? 'mine' : 'theirs'}${msg.deleted ? ' deleted' : ''}${(msg.mentions ?? []).includes(state.me) ? ' mentions-me' : ''}`,
      dataset: { testid: 'message', seq: msg.seq, senderId: msg.senderId, shownAt: msg.shownAt },
    },
    el(
      'div',
      { class: 'bubble' },
      isGroup && !mine ? el('div', { class: 'sender' }, userName(msg.senderId)) : null,
      bodyOf(msg),
      msg.deleted ? null : reactionsRow(msg),
      meta,
    ),
    repliesRow(msg, heldReplies),
  );
}

function bodyOf(msg) {
  return msg.deleted
    ? el('div', { class: 'body muted' }, 'message deleted')
    : el('div', { class: 'body', dataset: { testid: 'message-body' } }, msg.body ?? '');
}

/** Under a top-level message: "N replies" (marked while unread) and "Reply", both open its thread. */
function repliesRow(msg, heldReplies) {
  const count = Math.max(msg.thread?.replyCount ?? 0, heldReplies);
  const unread = Boolean(msg.thread?.unread);
  const link =
    count > 0
      ? el(
          'button',
          {
            type: 'button',
            class: `link replies${unread ? ' unread' : ''}`,
            title: unread ? 'New replies' : 'Open the thread',
            dataset: { action: 'open-thread', seq: msg.seq, testid: 'replies', unread: String(unread) },
          },
          `${count} ${count === 1 ? 'reply' : 'replies'}`,
        )
      : null;
  const reply = msg.deleted
    ? null
    : el('button', { type: 'button', class: 'link', dataset: { action: 'reply', seq: msg.seq, testid: 'reply' } }, 'Reply');
  if (!link && !reply) return null;
  return el('div', { class: 'replies-row' }, link, reply);
}

/** A message's reactions as buttons (click: add or take back yours), and "+" for more. */
function reactionsRow(msg) {
  const chips = (msg.reactions ?? []).map((r) =>
    el(
      'button',
      {
        type: 'button',
        class: `reaction${r.me ? ' me' : ''}`,
        title: r.me ? 'Take your reaction back' : 'React',
        dataset: { action: 'react', seq: msg.seq, key: r.key, testid: 'reaction' },
      },
      `${r.key} ${r.count}`,
    ),
  );
  const palette =
    state.reactingTo === msg.seq
      ? QUICK_REACTIONS.map((key) =>
          el('button', { type: 'button', class: 'reaction choice', dataset: { action: 'react', seq: msg.seq, key, testid: 'reaction-choice' } }, key),
        )
      : [];
  const more = el(
    'button',
    { type: 'button', class: 'link action', title: 'React', dataset: { action: 'react-menu', seq: msg.seq, testid: 'react' } },
    '+',
  );
  return el('div', { class: 'reactions' }, ...chips, ...palette, more);
}

function pendingRow(pending) {
  const meta = pending.failed
    ? el(
        'div',
        { class: 'meta' },
        el('span', { class: 'error' }, 'Not sent'),
        el('button', { type: 'button', class: 'link action visible', dataset: { action: 'retry', clientMsgId: pending.clientMsgId } }, 'Retry'),
      )
    : el('div', { class: 'meta' }, el('span', { class: 'status' }, 'Sending…'));
  return el(
    'li',
    { class: 'message mine pending', dataset: { testid: 'message-pending' } },
    el('div', { class: 'bubble' }, el('div', { class: 'body' }, pending.body), meta),
  );
}

/** The thread panel: the root on top, its replies, then your replies being sent. */
function renderThreadPanel() {
  const panel = state.threadPanel;
  const thread = panel && panel.conversationId === state.openId ? state.threads.get(panel.conversationId) : null;
  const root = thread?.messages.get(panel.rootSeq);
  $('thread-panel').hidden = !root;
  document.body.classList.toggle('thread-open', Boolean(root));
  if (!root) {
    renderedPanelKey = null;
    delete $('thread-panel').dataset.rootSeq;
    return;
  }
  const key = `${panel.conversationId}:${panel.rootSeq}:${thread.version}:${panel.loaded}`;
  if (key === renderedPanelKey) return;
  renderedPanelKey = key;

  const scroller = $('thread-scroll');
  const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
  const replies = repliesOf(thread, panel.rootSeq);
  const count = Math.max(root.thread?.replyCount ?? 0, replies.filter((m) => !m.deleted).length);
  $('thread-panel').dataset.rootSeq = panel.rootSeq;
  $('thread-count').textContent = `${count} ${count === 1 ? 'reply' : 'replies'}`;
  $('thread-follow').textContent = root.thread?.following ? 'Unfollow' : 'Follow';
  $('thread-composer').hidden = Boolean(root.deleted); // no replies to a deleted message
  $('thread-root').replaceChildren(threadRootView(root));
  const pending = thread.pendingReplies.filter((p) => p.rootSeq === panel.rootSeq).map(pendingReplyRow);
  const loading = !panel.loaded && replies.length === 0 ? el('li', { class: 'hint center' }, 'Loading replies…') : null;
  $('thread-messages').replaceChildren(...replies.map(threadMessageRow), ...pending, ...(loading ? [loading] : []));
  if (threadPanelScroll === 'bottom' || atBottom) scroller.scrollTop = scroller.scrollHeight;
  threadPanelScroll = null;
}

function threadRootView(root) {
  return el(
    'div',
    { class: `message ${root.senderId === state.me ? 'mine' : 'theirs'}${root.deleted ? ' deleted' : ''}`, dataset: { testid: 'thread-root', seq: root.seq } },
    el(
      'div',
      { class: 'bubble' },
      el('div', { class: 'sender' }, userName(root.senderId)),
      bodyOf(root),
      el('div', { class: 'meta' }, el('time', { datetime: root.createdAt }, formatTime(root.createdAt))),
    ),
  );
}

/** A reply in the thread panel: sender, body, time, and Edit/Delete on your own. */
function threadMessageRow(msg) {
  const mine = msg.senderId === state.me;
  const meta = el('div', { class: 'meta' }, el('time', { datetime: msg.createdAt }, formatTime(msg.createdAt)));
  if (msg.editedAt && !msg.deleted) meta.append(el('span', { class: 'edited' }, 'edited'));
  if (mine && !msg.deleted) {
    meta.append(
      el('button', { type: 'button', class: 'link action', dataset: { action: 'edit', seq: msg.seq } }, 'Edit'),
      el('button', { type: 'button', class: 'link action', dataset: { action: 'delete', seq: msg.seq } }, 'Delete'),
    );
  }
  return el(
    'li',
    {
      class: `message ${mine ? 'mine' : 'theirs'}${msg.deleted ? ' deleted' : ''}${(msg.mentions ?? []).includes(state.me) ? ' mentions-me' : ''}`,
      dataset: { testid: 'thread-message', seq: msg.seq, senderId: msg.senderId, shownAt: msg.shownAt },
    },
    el('div', { class: 'bubble' }, mine ? null : el('div', { class: 'sender' }, userName(msg.senderId)), bodyOf(msg), meta),
  );
}

function pendingReplyRow(pending) {
  const meta = pending.failed
    ? el(
        'div',
        { class: 'meta' },
        el('span', { class: 'error' }, 'Not sent'),
        el('button', { type: 'button', class: 'link action visible', dataset: { action: 'retry-reply', clientMsgId: pending.clientMsgId } }, 'Retry'),
      )
    : el('div', { class: 'meta' }, el('span', { class: 'status' }, 'Sending…'));
  return el(
    'li',
    { class: 'message mine pending', dataset: { testid: 'thread-pending' } },
    el('div', { class: 'bubble' }, el('div', { class: 'body' }, pending.body), meta),
  );
}

// ---------------------------------------------------------------------------
// Wiring the page
// ---------------------------------------------------------------------------

function parseUserId(text) {
  const id = Number(String(text).trim());
  return Number.isSafeInteger(id) && id > 0 ? id : null;
}

function wire() {
  $('login-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const userId = parseUserId($('login-user').value);
    $('login-error').textContent = '';
    if (!userId) {
      $('login-error').textContent = 'A user id is a positive whole number.';
      return;
    }
    try {
      await signIn(userId);
    } catch (err) {
      $('login-error').textContent = err.message;
    }
  });

  $('sign-out').addEventListener('click', signOut);

  $('new-direct').addEventListener('submit', async (event) => {
    event.preventDefault();
    const peerId = parseUserId($('new-direct-peer').value);
    if (!peerId) return showError('A user id is a positive whole number.');
    try {
      await startDirect(peerId);
      $('new-direct-peer').value = '';
    } catch (err) {
      showError(err);
    }
  });

  $('new-group-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const ids = $('new-group-members').value.split(/[\s,]+/).filter(Boolean).map(parseUserId);
    if (ids.length === 0 || ids.includes(null)) return showError('Members: user ids separated by commas.');
    try {
      await createGroup($('new-group-title').value.trim(), ids);
      $('new-group-form').reset();
      $('new-group').open = false;
    } catch (err) {
      showError(err);
    }
  });

  $('inbox-more').addEventListener('click', () => loadInbox({ more: true }).catch(showError));
  $('close-conversation').addEventListener('click', () => (location.hash = '#/'));
  $('load-older').addEventListener('click', () => loadOlder().catch(showError));

  const composer = $('composer');
  $('composer-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = composer.value;
    if (!state.openId || text.trim() === '') return;
    composer.value = '';
    $('mention-picker').hidden = true;
    sendMessage(text);
  });
  composer.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $('composer-form').requestSubmit();
    }
  });
  composer.addEventListener('input', onComposerInput);
  $('mention-picker').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-mention]');
    if (button) pickMention(Number(button.dataset.mention));
  });
  $('mute').addEventListener('click', () => toggleMute().catch(showError));

  $('messages').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-action]');
    if (!button) return;
    const { action, seq, clientMsgId } = button.dataset;
    if (action === 'react') toggleReaction(Number(seq), button.dataset.key).catch(showError);
    if (action === 'react-menu') {
      state.reactingTo = state.reactingTo === Number(seq) ? null : Number(seq);
      state.threads.get(state.openId).version++;
      render();
    }
    if (action === 'edit') editMessage(Number(seq)).catch(showError);
    if (action === 'delete') deleteMessage(Number(seq)).catch(showError);
    if (action === 'reply' || action === 'open-thread') openThreadPanel(Number(seq)).catch(showError);
    if (action === 'retry') {
      const thread = state.threads.get(state.openId);
      const pending = thread?.pending.find((p) => p.clientMsgId === clientMsgId);
      if (pending) deliver(state.openId, thread, pending);
    }
  });

  wireThreadPanel();
  window.addEventListener('hashchange', route);
  document.addEventListener('visibilitychange', () => markReadIfVisible());
}

function wireThreadPanel() {
  $('close-thread').addEventListener('click', closeThreadPanel);
  $('thread-follow').addEventListener('click', () => toggleFollow().catch(showError));
  const input = $('thread-input');
  $('thread-composer').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = input.value;
    if (!state.threadPanel || text.trim() === '') return;
    input.value = '';
    sendReply(text);
  });
  input.addEventListener('input', () => sendTyping(input.value));
  $('thread-messages').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-action]');
    if (!button) return;
    const { action, seq, clientMsgId } = button.dataset;
    if (action === 'edit') editMessage(Number(seq)).catch(showError);
    if (action === 'delete') deleteMessage(Number(seq)).catch(showError);
    if (action === 'retry-reply') {
      const thread = state.threads.get(state.openId);
      const pending = thread?.pendingReplies.find((p) => p.clientMsgId === clientMsgId);
      if (pending) deliverReply(state.openId, thread, pending);
    }
  });
}

/** Signs in at once with ?user=10 in the address, or as the user of this tab before. */
function boot() {
  wire();
  const fromUrl = new URLSearchParams(location.search).get('user');
  const userId = parseUserId(fromUrl ?? sessionStorage.getItem('chatpipe.user') ?? '');
  if (userId) {
    $('login-user').value = userId;
    signIn(userId).catch((err) => ($('login-error').textContent = err.message));
  }
}

boot();
