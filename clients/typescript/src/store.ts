/**
 * The conversations one user's client holds, kept right by the rules of
 * docs/protocol.md ("Rules for a correct client") so an app does not have to:
 * - **dedupe** pushes and catch-ups by `(conversationId, seq)`;
 * - **fill gaps**: a push more than one past the last seq held fetches the ones between;
 * - **the sync cursor chain**: each catch-up starts where the last one ended, pages
 *   while `hasMore`, and starts over on `409 cursor-stale`;
 * - **early edits and deletes** (before their message) are kept and applied when it
 *   comes, and a deleted message never gets its body back;
 * - **pending sends** are stored before they go, retried with the same `clientMsgId`
 *   (so never sent twice) until the API answers, and survive a reload ({@link Outbox}).
 *
 * Feed it the gateway's frames ({@link ConversationStore.apply}) and catch it up when the
 * gateway says so ({@link ConversationStore.catchUp} from `onCatchUp`).
 */
import type { Frame, MessageDeleted, MessageEdited, MessageNew, ReadUpdated } from './frames.js';
import { Outbox, type PendingSend } from './outbox.js';
import { ProblemError } from './problem.js';
import type { Rest, Schemas } from './rest.js';
import type { Storage } from './storage.js';
import { MemoryStorage } from './storage.js';

/** A message as the store holds it: as history shows it, a deleted one without body. */
export interface Message {
  seq: number;
  senderId: number;
  clientMsgId: string;
  createdAt: string;
  body: string | null;
  editedAt?: string | null;
  deleted?: boolean;
  threadRootSeq?: number | null;
  mentions?: number[];
}

/** A conversation as the store holds it. */
export interface Conversation {
  conversationId: number;
  lastSeq: number;
  lastReadSeq: number;
  title?: string | null;
  /** By seq. */
  messages: Record<number, Message>;
  /** Edits and deletes of seqs not held yet, applied when they come. */
  early: Record<number, { body?: string; editedAt?: string | null; deleted?: boolean }>;
  /** Every seq up to this one is held (see `highest`). */
  contiguous?: number;
}

export interface StoreOptions {
  rest: Rest;
  /** The user this store belongs to. */
  userId: number;
  storage?: Storage;
  /** Something changed in this conversation (or, `null`, in the list of them). */
  onChange?: (conversationId: number | null) => void;
  /**
   * A catch-up or a fill from history failed (the API unreachable, say): what it was to
   * bring comes with the next catch-up (the cursor stays where it was). `console.warn`
   * by default.
   */
  onError?: (err: unknown) => void;
  /** Retries of a send that got no answer wait about this long, doubling up to `maxRetryMs`. */
  firstRetryMs?: number;
  maxRetryMs?: number;
  /** History page size when filling gaps. */
  pageSize?: number;
}

const STATE_KEY = 'chatpipe.state';

export class ConversationStore {
  private conversations = new Map<number, Conversation>();
  private cursor: string | undefined;
  private readonly storage: Storage;
  private readonly outbox: Outbox;
  private catchingUp: Promise<void> = Promise.resolve();

  constructor(private readonly options: StoreOptions) {
    this.storage = options.storage ?? new MemoryStorage();
    this.outbox = new Outbox({
      rest: options.rest,
      storage: this.storage,
      firstRetryMs: options.firstRetryMs,
      maxRetryMs: options.maxRetryMs,
      committed: (p, sent) => this.sent(p, sent),
      refused: (p) => this.options.onChange?.(p.conversationId),
    });
  }

  /** Loads what the storage holds and sends what was pending when it was saved. */
  async open(): Promise<void> {
    const state = await this.storage.get(STATE_KEY);
    if (state) {
      const saved = JSON.parse(state) as { cursor?: string; conversations: Conversation[] };
      this.cursor = saved.cursor;
      this.conversations = new Map(saved.conversations.map((c) => [c.conversationId, c]));
    }
    await this.outbox.open();
  }

  /** Stops retrying (what is pending stays in the storage). */
  close(): void {
    this.outbox.close();
  }

  conversation(id: number): Conversation | undefined {
    return this.conversations.get(id);
  }

  /** The conversation's messages, by seq. */
  messages(id: number): Message[] {
    const c = this.conversations.get(id);
    return c ? Object.values(c.messages).sort((a, b) => a.seq - b.seq) : [];
  }

  /** Sends not yet committed, oldest first, and those the API refused (`refused`). */
  pendingSends(): readonly PendingSend[] {
    return this.outbox.pending;
  }

  /**
   * Everything that changed since the last catch-up (the sync cursor chain), one at a
   * time: a second call while one runs waits for it and runs after. Never rejects: a
   * failure goes to `onError`.
   */
  catchUp(): Promise<void> {
    this.catchingUp = this.catchingUp.then(() => this.sync()).catch((err) => this.failed(err));
    return this.catchingUp;
  }

  private failed(err: unknown): void {
    (this.options.onError ?? ((e: unknown) => console.warn('chatpipe store:', e)))(err);
  }

  private async sync(): Promise<void> {
    let since = this.cursor;
    for (;;) {
      let page: Schemas['SyncPage'];
      try {
        page = await this.options.rest.sync(since);
      } catch (err) {
        if (err instanceof ProblemError && err.code === 'cursor-stale' && since !== undefined) {
          since = undefined; // another history of the database: start over
          this.conversations.clear();
          continue;
        }
        throw err;
      }
      for (const entry of page.conversations) {
        if ('left' in entry && entry.left) {
          this.conversations.delete(entry.conversationId);
          this.options.onChange?.(null);
        } else {
          await this.applyChanged(entry as Schemas['Changed']);
        }
      }
      since = page.nextCursor;
      if (!page.hasMore) break;
    }
    this.cursor = since;
    await this.save();
  }

  private async applyChanged(entry: Schemas['Changed']): Promise<void> {
    const c = this.held(entry.conversationId);
    const before = highest(c);
    c.lastSeq = Math.max(c.lastSeq, entry.lastSeq);
    c.lastReadSeq = Math.max(c.lastReadSeq, entry.lastReadSeq);
    c.title = entry.title;
    for (const m of entry.messages) this.put(c, fromHistory(m));
    // More changed than the answer holds, or history never fetched: fill from what was held.
    const first = entry.messages[0]?.seq ?? c.lastSeq + 1;
    if (entry.hasMore || first > before + 1) await this.fill(c, before);
    this.options.onChange?.(c.conversationId);
  }

  /** A frame from the gateway. Never rejects: a failed fill goes to `onError`. */
  async apply(frame: Frame): Promise<void> {
    try {
      await this.applyFrame(frame);
    } catch (err) {
      this.failed(err);
    }
  }

  private async applyFrame(frame: Frame): Promise<void> {
    switch (frame.type) {
      case 'message.new':
        return this.onNew(frame as MessageNew);
      case 'message.edited':
        return this.onEdited(frame as MessageEdited);
      case 'message.deleted':
        return this.onDeleted(frame as MessageDeleted);
      case 'read.updated': {
        const r = frame as ReadUpdated;
        const c = this.conversations.get(r.conversationId);
        if (c && (r.userId === this.options.userId || r.light)) {
          c.lastReadSeq = Math.max(c.lastReadSeq, r.lastReadSeq);
          this.options.onChange?.(c.conversationId);
        }
        return;
      }
      default:
      // Other frames (typing, reactions, ready, …) change no message here.
    }
  }

  private async onNew(f: MessageNew): Promise<void> {
    const c = this.held(f.conversationId);
    if (c.messages[f.seq]) return; // a repeated push, or one a catch-up brought
    const before = highest(c);
    c.lastSeq = Math.max(c.lastSeq, f.seq);
    if (f.light || f.body === undefined || f.senderId === undefined) {
      await this.fill(c, before); // where to look only: fetch it (and any gap before it)
    } else {
      if (f.seq > before + 1) await this.fill(c, before, f.seq - 1);
      this.put(c, {
        seq: f.seq,
        senderId: f.senderId,
        clientMsgId: f.clientMsgId ?? '',
        createdAt: f.createdAt ?? new Date().toISOString(),
        body: f.body,
        threadRootSeq: f.threadRootSeq ?? null,
        mentions: f.mentions,
      });
    }
    if (f.clientMsgId) await this.outbox.pushed(f.clientMsgId);
    this.options.onChange?.(c.conversationId);
    await this.save();
  }

  private async onEdited(f: MessageEdited): Promise<void> {
    const c = this.held(f.conversationId);
    const m = c.messages[f.seq];
    if (f.light || f.body === undefined) {
      if (m) await this.refetch(c, f.seq);
    } else if (!m) {
      c.early[f.seq] = { ...c.early[f.seq], body: f.body, editedAt: f.editedAt ?? null };
    } else if (!m.deleted) {
      m.body = f.body;
      m.editedAt = f.editedAt ?? m.editedAt ?? null;
    }
    this.options.onChange?.(c.conversationId);
    await this.save();
  }

  private async onDeleted(f: MessageDeleted): Promise<void> {
    const c = this.held(f.conversationId);
    const m = c.messages[f.seq];
    if (m) {
      m.deleted = true;
      m.body = null;
    } else {
      c.early[f.seq] = { deleted: true };
    }
    this.options.onChange?.(c.conversationId);
    await this.save();
  }

  /**
   * Sends a message: stored as pending first, then sent (after the sends before it, in
   * order), and retried with the same `clientMsgId` until the API answers. Resolves with
   * the pending send; the message itself appears when it is committed.
   */
  send(conversationId: number, body: string, options: { threadRootSeq?: number } = {}): Promise<PendingSend> {
    return this.outbox.add({ conversationId, body, threadRootSeq: options.threadRootSeq });
  }

  /** The outbox committed `p` as `sent`: the store holds it from now on. */
  private async sent(p: PendingSend, sent: Schemas['SentMessage']): Promise<void> {
    const c = this.held(p.conversationId);
    const before = highest(c);
    c.lastSeq = Math.max(c.lastSeq, sent.seq);
    if (sent.seq > before + 1) await this.fill(c, before, sent.seq - 1);
    if (!c.messages[sent.seq]) {
      this.put(c, {
        seq: sent.seq,
        senderId: sent.senderId,
        clientMsgId: sent.clientMsgId,
        createdAt: sent.createdAt,
        body: p.body,
        threadRootSeq: sent.threadRootSeq ?? null,
      });
    }
    this.options.onChange?.(p.conversationId);
    await this.save();
  }

  /** Fetches the messages after `after` (up to `until`, or the end) into `c`. */
  private async fill(c: Conversation, after: number, until = Infinity): Promise<void> {
    let from = after;
    for (;;) {
      const page = await this.options.rest.history(c.conversationId, {
        afterSeq: from,
        limit: this.options.pageSize ?? 100,
      });
      for (const m of page.messages) if (m.seq <= until) this.put(c, fromHistory(m));
      c.lastSeq = Math.max(c.lastSeq, page.lastSeq);
      const last = page.messages.at(-1)?.seq;
      if (!page.hasMore || last === undefined || last >= until) return;
      from = last;
    }
  }

  private async refetch(c: Conversation, seq: number): Promise<void> {
    const page = await this.options.rest.history(c.conversationId, { afterSeq: seq - 1, limit: 1 });
    for (const m of page.messages) if (m.seq === seq) this.put(c, fromHistory(m));
  }

  /** Puts a message as history or a push has it: a deleted one stays deleted; early changes apply. */
  private put(c: Conversation, m: Message): void {
    const held = c.messages[m.seq];
    const early = c.early[m.seq];
    delete c.early[m.seq];
    const deleted = Boolean(held?.deleted || m.deleted || early?.deleted);
    // The latest edit wins: an early one over a message never edited, the one held over
    // an older state (a catch-up's snapshot taken before a pushed edit).
    const edited = early?.body !== undefined && !m.editedAt ? early : undefined;
    const newer = held?.editedAt && time(held.editedAt) > time(m.editedAt) ? held : undefined;
    c.messages[m.seq] = {
      ...m,
      body: deleted ? null : (edited?.body ?? newer?.body ?? m.body),
      editedAt: edited?.editedAt ?? newer?.editedAt ?? m.editedAt ?? null,
      deleted: deleted || undefined,
    };
    c.lastSeq = Math.max(c.lastSeq, m.seq);
  }

  private held(id: number): Conversation {
    let c = this.conversations.get(id);
    if (!c) {
      c = { conversationId: id, lastSeq: 0, lastReadSeq: 0, messages: {}, early: {} };
      this.conversations.set(id, c);
    }
    return c;
  }

  private async save(): Promise<void> {
    const state = { cursor: this.cursor, conversations: [...this.conversations.values()] };
    await this.storage.set(STATE_KEY, JSON.stringify(state));
  }

}

function time(at: string | null | undefined): number {
  return at ? Date.parse(at) : -Infinity;
}

/**
 * The highest seq held with every seq below it held too (0: none). Messages are never
 * dropped from a conversation, so it only grows: kept in `contiguous`, walked on from there.
 */
function highest(c: Conversation): number {
  let seq = c.contiguous ?? 0;
  while (c.messages[seq + 1]) seq++;
  c.contiguous = seq;
  return seq;
}

function fromHistory(m: Schemas['HistoryMessage']): Message {
  return {
    seq: m.seq,
    senderId: m.senderId,
    clientMsgId: m.clientMsgId,
    createdAt: m.createdAt,
    body: m.deleted ? null : (m.body ?? null),
    editedAt: m.editedAt ?? null,
    deleted: m.deleted || undefined,
    threadRootSeq: m.threadRootSeq ?? null,
    mentions: m.mentions,
  };
}
