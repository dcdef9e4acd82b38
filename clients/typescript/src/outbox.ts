/**
 * Sends not yet committed: stored before they go, sent oldest first one at a time (so a
 * conversation's messages commit in the order they were written), retried with the same
 * `clientMsgId` (the API commits a message once per `clientMsgId`, so a retry whose
 * first attempt did commit gets the same seq back) until the API answers, with backoff
 * and `Retry-After`. A refusal (a 4xx other than 408 and 429) is kept, marked, for the
 * app to show. What is pending survives a reload: it lives in the {@link Storage}.
 */
import { ProblemError } from './problem.js';
import type { Rest, Schemas } from './rest.js';
import type { Storage } from './storage.js';

/** A send not yet committed (or refused: `refused` says why). */
export interface PendingSend {
  conversationId: number;
  clientMsgId: string;
  body: string;
  threadRootSeq?: number;
  queuedAt: string;
  refused?: { type: string; detail: string };
}

export interface OutboxOptions {
  rest: Rest;
  storage: Storage;
  firstRetryMs?: number;
  maxRetryMs?: number;
  /** `p` is committed as `sent`. */
  committed: (p: PendingSend, sent: Schemas['SentMessage']) => Promise<void>;
  /** The API refused `p`. */
  refused: (p: PendingSend) => void;
}

const PENDING_KEY = 'chatpipe.pending';

export class Outbox {
  pending: PendingSend[] = [];
  private pumping = false;
  private closed = false;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly options: OutboxOptions) {}

  /** Loads what was pending and sends it. */
  async open(): Promise<void> {
    const saved = await this.options.storage.get(PENDING_KEY);
    this.pending = saved ? (JSON.parse(saved) as PendingSend[]) : [];
    this.pump();
  }

  /** Stops sending; what is pending stays stored. */
  close(): void {
    this.closed = true;
    clearTimeout(this.retryTimer);
  }

  async add(send: { conversationId: number; body: string; threadRootSeq?: number }): Promise<PendingSend> {
    const p: PendingSend = {
      ...send,
      clientMsgId: crypto.randomUUID(),
      queuedAt: new Date().toISOString(),
    };
    this.pending.push(p);
    await this.save();
    this.pump();
    return p;
  }

  /** A push carried this `clientMsgId`: it is committed, whatever its answer does. */
  async pushed(clientMsgId: string): Promise<void> {
    const before = this.pending.length;
    this.pending = this.pending.filter((p) => p.clientMsgId !== clientMsgId);
    if (this.pending.length !== before) await this.save();
  }

  /** Sends what is pending, oldest first, one at a time; a no-op while it runs. */
  private pump(): void {
    if (this.pumping || this.closed) return;
    this.pumping = true;
    void (async () => {
      let attempt = 0;
      for (;;) {
        const p = this.pending.find((q) => !q.refused);
        if (!p || this.closed) break;
        const wait = await this.deliver(p, attempt);
        if (wait === null) {
          attempt = 0;
          continue;
        }
        attempt++;
        if (this.closed) break;
        await new Promise((resolve) => {
          this.retryTimer = setTimeout(resolve, wait);
        });
      }
      this.pumping = false;
    })();
  }

  /** One attempt: `null` when the send is done (committed or refused), else how long to wait. */
  private async deliver(p: PendingSend, attempt: number): Promise<number | null> {
    let sent: Schemas['SentMessage'];
    try {
      sent = await this.options.rest.send(p.conversationId, {
        clientMsgId: p.clientMsgId,
        body: p.body,
        threadRootSeq: p.threadRootSeq,
      });
    } catch (err) {
      if (err instanceof ProblemError && err.status < 500 && err.status !== 429 && err.status !== 408) {
        p.refused = { type: err.type, detail: err.detail };
        await this.save();
        this.options.refused(p);
        return null;
      }
      const first = this.options.firstRetryMs ?? 500;
      const ceiling = Math.min(this.options.maxRetryMs ?? 30_000, first * 2 ** attempt);
      const asked = err instanceof ProblemError && err.retryAfter !== null ? err.retryAfter * 1000 : 0;
      return Math.max(asked, ceiling / 2 + Math.random() * (ceiling / 2));
    }
    await this.pushed(p.clientMsgId);
    await this.options.committed(p, sent);
    return null;
  }

  private async save(): Promise<void> {
    await this.options.storage.set(PENDING_KEY, JSON.stringify(this.pending));
  }
}
