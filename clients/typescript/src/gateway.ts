/**
 * One user's WebSocket connection to a gateway (docs/protocol.md): authenticated with a
 * token from the caller's provider (a new one after 4001 or 4002, and a fresh socket a
 * little before the token expires, so no push falls between the two), reconnecting with
 * backoff and jitter, and telling the caller when to catch up over REST: on `ready`
 * (this socket's pushes are live) and on `resync`.
 */
import type { Frame, Ready } from './frames.js';
import type { TokenProvider } from './rest.js';

/** The subprotocol of this protocol's version. */
export const SUBPROTOCOL = 'chatpipe.v1';

/** Close codes the gateway uses (docs/protocol.md, "Close codes"). */
export const CloseCode = {
  GoingAway: 1001,
  Overflow: 1008,
  TryAgainLater: 1013,
  Unauthorized: 4001,
  TokenExpired: 4002,
  Replaced: 4008,
} as const;

export type ConnectionState =
  | 'connecting'
  | 'open'
  | 'ready'
  | 'reconnecting'
  | 'replaced'
  | 'stopped';

export interface GatewayOptions {
  /** `ws://…/ws` or `wss://…/ws`. */
  url: string;
  token: TokenProvider;
  /** Every frame, `ready` and `resync` included. */
  onFrame?: (frame: Frame) => void;
  /** Catch up over REST now: `ready` (pushes are live) or `resync` (pushes were lost). */
  onCatchUp?: (why: Ready | { type: 'resync'; reason: string }) => void;
  onState?: (state: ConnectionState, detail?: string) => void;
  /** The first reconnect waits about this long, doubling up to `maxBackoffMs`. */
  firstBackoffMs?: number;
  maxBackoffMs?: number;
  /** Open a new socket this long before the token's `exp`. */
  renewBeforeExpiryMs?: number;
  /** A WebSocket class of your own; the global one otherwise (browsers, Node ≥ 22). */
  WebSocket?: typeof globalThis.WebSocket;
}

/** A socket that stayed open this long resets the backoff. */
const STABLE_AFTER_MS = 10_000;

export class Gateway {
  private readonly options: Required<
    Pick<GatewayOptions, 'firstBackoffMs' | 'maxBackoffMs' | 'renewBeforeExpiryMs'>
  > &
    GatewayOptions;
  private readonly Socket: typeof globalThis.WebSocket;
  private ws: WebSocket | null = null;
  private stopped = true;
  private failures = 0;
  private refresh = false;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  private renewTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(options: GatewayOptions) {
    this.options = {
      firstBackoffMs: 500,
      maxBackoffMs: 30_000,
      renewBeforeExpiryMs: 5 * 60_000,
      ...options,
    };
    const Socket = options.WebSocket ?? globalThis.WebSocket;
    if (!Socket) throw new Error('no WebSocket class: pass one (options.WebSocket)');
    this.Socket = Socket;
  }

  start(): void {
    this.stopped = false;
    void this.connect();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.renewTimer);
    this.ws?.close(1000, 'stopped');
    this.ws = null;
    this.options.onState?.('stopped');
  }

  /** Sends `ack` or `typing` if the socket is open (never queued: acks are cumulative). */
  send(frame: { type: 'ack'; conversationId: number; seq: number } | { type: 'typing'; conversationId: number }): boolean {
    if (this.ws?.readyState !== this.Socket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  private async connect(previous: WebSocket | null = null): Promise<void> {
    clearTimeout(this.retryTimer);
    if (!previous) this.options.onState?.(this.failures === 0 ? 'connecting' : 'reconnecting');
    let token: string;
    try {
      token = await this.options.token({ refresh: this.refresh });
      this.refresh = false;
    } catch (err) {
      if (!previous) this.retry(`no token: ${(err as Error).message}`);
      return;
    }
    if (!this.stopped) this.open(token, previous);
  }

  /** Opens a socket; `previous` (a renewal) is closed once the new one is open. */
  private open(token: string, previous: WebSocket | null): void {
    const ws = new this.Socket(this.options.url, [SUBPROTOCOL, `bearer.${token}`]);
    let openedAt = 0;
    this.ws = ws;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      openedAt = Date.now();
      previous?.close(1000, 'renewed');
      this.options.onState?.('open');
      this.scheduleRenewal(token);
    };
    ws.onmessage = (event: MessageEvent) => {
      if (ws !== this.ws) return;
      let frame: Frame;
      try {
        frame = JSON.parse(String(event.data)) as Frame;
      } catch {
        return;
      }
      if (typeof frame?.type !== 'string') return;
      if (frame.type === 'ready') {
        this.options.onState?.('ready');
        this.options.onCatchUp?.(frame as Ready);
      } else if (frame.type === 'resync') {
        this.options.onCatchUp?.({ type: 'resync', reason: String(frame.reason) });
      }
      this.options.onFrame?.(frame);
    };
    let ended = false;
    const end = (code: number, reason: string) => {
      if (ended) return;
      ended = true;
      if (ws !== this.ws || this.stopped) return;
      if (!openedAt && previous?.readyState === this.Socket.OPEN) {
        this.ws = previous; // the renewal failed: the old socket lives until its 4002
        return;
      }
      this.ws = null;
      if (openedAt && Date.now() - openedAt > STABLE_AFTER_MS) this.failures = 0;
      this.closed(code, reason);
    };
    ws.onclose = (event: CloseEvent) => end(event.code, event.reason);
    // An error ends the socket (1006) whether or not `close` follows: Node's WebSocket
    // (20.x) fires only `error` when the connection cannot be made (a gateway down or
    // restarting), and a client that waited for `close` would never try again.
    ws.onerror = () => end(1006, 'connection failed');
  }

  private closed(code: number, reason: string): void {
    if (code === CloseCode.Replaced) {
      // A newer connection of this user took this one's place: do not fight it.
      this.stopped = true;
      clearTimeout(this.renewTimer);
      this.options.onState?.('replaced', reason);
      return;
    }
    if (code === CloseCode.Unauthorized || code === CloseCode.TokenExpired) this.refresh = true;
    this.retry(`closed ${code}${reason ? `: ${reason}` : ''}`);
  }

  private retry(why: string): void {
    if (this.stopped) return;
    const { firstBackoffMs, maxBackoffMs } = this.options;
    const ceiling = Math.min(maxBackoffMs, firstBackoffMs * 2 ** this.failures);
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.failures++;
    this.options.onState?.('reconnecting', `${why}; retrying in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => void this.connect(), delay);
  }

  /** A little before the token's `exp`: a new token, a new socket, then the old one closes. */
  private scheduleRenewal(token: string): void {
    clearTimeout(this.renewTimer);
    const exp = expiresAtMs(token);
    if (exp === null) return;
    const due = exp - this.options.renewBeforeExpiryMs - Date.now();
    if (due <= 0 || due > 2 ** 31 - 1) return;
    this.renewTimer = setTimeout(() => {
      if (this.stopped || !this.ws) return;
      this.refresh = true;
      void this.connect(this.ws);
    }, due);
  }
}

/** The `exp` of a JWT in milliseconds, or null. */
function expiresAtMs(jwt: string): number | null {
  const payload = jwt.split('.')[1];
  if (!payload) return null;
  try {
    const json = JSON.parse(atob(payload.replace(/-/g, '+').replace(/_/g, '/'))) as { exp?: unknown };
    return typeof json.exp === 'number' ? json.exp * 1000 : null;
  } catch {
    return null;
  }
}
