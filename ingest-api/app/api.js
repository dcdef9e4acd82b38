// chatpipe browser client: talking to the servers.
//
//   request()      one REST call; problem+json answers become ApiError
//   Api            the REST API for one signed-in user (renews its demo token on 401)
//   Gateway        the WebSocket: connects, reconnects with backoff, renews the token
//
// Nothing here touches the page; app.js owns state and rendering.
// docs/api.md and docs/protocol.md describe every call and frame used here.

/** A refused REST call, with the problem+json fields (RFC 9457) the API answered. */
export class ApiError extends Error {
  constructor(status, problem = {}, retryAfterSecs = null) {
    const title = problem.title || `HTTP ${status}`;
    super(problem.detail ? `${title}: ${problem.detail}` : title);
    this.name = 'ApiError';
    this.status = status;
    this.type = problem.type || null;
    this.title = title;
    this.detail = problem.detail || null;
    this.field = problem.field || null;
    this.retryAfterSecs = retryAfterSecs;
  }
}

/** The request never got an answer (server down, connection dropped). */
export class NetworkError extends Error {
  constructor(cause) {
    super(`network error: ${cause.message}`);
    this.name = 'NetworkError';
    this.cause = cause;
  }
}

/**
 * One REST call. `body` is sent as JSON; `query` values that are null/undefined are
 * left out. Resolves to the parsed JSON answer (null for 204), or rejects with
 * ApiError / NetworkError.
 */
export async function request(method, path, { token, body, query } = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
  }
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';

  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new NetworkError(err);
  }

  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const retryAfter = Number(response.headers.get('Retry-After')) || null;
    throw new ApiError(response.status, data || {}, retryAfter);
  }
  return data;
}

/** Whether a failed send may be tried again with the same clientMsgId. */
function isRetryable(err) {
  if (err instanceof NetworkError) return true;
  // 429: over the rate limit; 503: not written or not answered in time; 500: nothing
  // was committed. The clientMsgId makes every retry safe (api.md, "send").
  return err instanceof ApiError && [429, 500, 503].includes(err.status);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs `attempt` until it succeeds, a failure is not retryable, or `tries` ran out:
 * backing off 0.5 s, 1 s, 2 s, … (at most 8 s), or as long as Retry-After says.
 */
export async function withRetry(attempt, tries = 6) {
  let delay = 500;
  for (let n = 1; ; n++) {
    try {
      return await attempt();
    } catch (err) {
      if (n >= tries || !isRetryable(err)) throw err;
      await sleep(err.retryAfterSecs ? err.retryAfterSecs * 1000 : delay);
      delay = Math.min(delay * 2, 8000);
    }
  }
}

// ---- demo endpoints (exist only when ingest-api runs with demo.enabled) ----

/** `POST /demo/token`: a token for any user id. */
export function demoToken(userId) {
  return request('POST', '/demo/token', { body: { userId } });
}

/** `GET /demo/config`: `{gatewayUrl}`. */
export function demoConfig() {
  return request('GET', '/demo/config');
}

/** The REST API as one user. */
export class Api {
  constructor(userId) {
    this.userId = userId;
    this.token = null;
    this.expiresAt = 0; // ms since epoch
    this.renewing = null;
  }

  /** Gets a fresh demo token (one request at a time, however many callers ask). */
  renewToken() {
    if (!this.renewing) {
      this.renewing = demoToken(this.userId)
        .then((answer) => {
          this.token = answer.token;
          this.expiresAt = Date.now() + answer.expiresInSecs * 1000;
          return answer.token;
        })
        .finally(() => {
          this.renewing = null;
        });
    }
    return this.renewing;
  }

  /** An authenticated call; a 401 renews the token and tries once more. */
  async call(method, path, options = {}) {
    if (!this.token) await this.renewToken();
    try {
      return await request(method, path, { ...options, token: this.token });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 401) throw err;
      await this.renewToken();
      return request(method, path, { ...options, token: this.token });
    }
  }

  // ---- conversations ----
  inbox(cursor, limit) {
    return this.call('GET', '/v1/inbox', { query: { cursor, limit } });
  }
  sync(since, limit) {
    return this.call('GET', '/v1/sync', { query: { since, limit } });
  }
  openDirect(peerId) {
    return this.call('POST', '/v1/direct', { body: { peerId } });
  }
  createGroup(title, memberIds) {
    const body = { type: 'GROUP', memberIds };
    if (title) body.title = title;
    return this.call('POST', '/v1/conversations', { body });
  }
  members(conversationId) {
    return this.call('GET', `/v1/conversations/${conversationId}/members`);
  }

  // ---- messages ----
  /** `{beforeSeq}` pages back, `{afterSeq}` fills a gap, neither gives the newest. */
  history(conversationId, { beforeSeq, afterSeq, limit } = {}) {
    return this.call('GET', `/v1/conversations/${conversationId}/messages`, {
      query: { beforeSeq, afterSeq, limit },
    });
  }

  /**
   * Sends a message. Retries (see withRetry) reuse the same clientMsgId, so the server
   * stores it once whatever happened to the earlier attempts. `mentions`: the member ids
   * the message names (@); `threadRootSeq`: makes it a reply in that message's thread.
   */
  send(conversationId, clientMsgId, body, mentions = [], threadRootSeq = null) {
    const payload = { clientMsgId, body };
    if (mentions.length > 0) payload.mentions = mentions;
    if (threadRootSeq !== null && threadRootSeq !== undefined) payload.threadRootSeq = threadRootSeq;
    return withRetry(() =>
      this.call('POST', `/v1/conversations/${conversationId}/messages`, { body: payload }),
    );
  }

  // ---- threads (replies) ----
  /** The replies of thread `rootSeq`, ascending, from `afterSeq` on (`hasMore`: page on). */
  threadReplies(conversationId, rootSeq, afterSeq = 0, limit = 200) {
    return this.call('GET', `/v1/conversations/${conversationId}/messages`, {
      query: { threadRootSeq: rootSeq, afterSeq, limit },
    });
  }

  /** Marks thread `rootSeq` read up to `seq` (forwards only, so retries are safe). */
  readThread(conversationId, rootSeq, seq) {
    return withRetry(() =>
      this.call('POST', `/v1/conversations/${conversationId}/threads/${rootSeq}/read`, { body: { seq } }),
    );
  }

  /** Follows thread `rootSeq` (or, with `follow` false, stops): `{lastReadSeq, following, unreadThreads}`. */
  followThread(conversationId, rootSeq, follow = true) {
    return this.call(follow ? 'PUT' : 'DELETE', `/v1/conversations/${conversationId}/threads/${rootSeq}/follow`);
  }

  /** Adds (or, with `remove`, takes back) the caller's reaction `key` to a message. */
  react(conversationId, seq, key, remove = false) {
    const path = `/v1/conversations/${conversationId}/messages/${seq}/reactions/${encodeURIComponent(key)}`;
    return this.call(remove ? 'DELETE' : 'PUT', path);
  }

  /** `level`: all | mentions | none. */
  setNotifications(conversationId, level) {
    return this.call('PUT', `/v1/conversations/${conversationId}/notifications`, { body: { level } });
  }

  editMessage(conversationId, seq, body) {
    return this.call('PATCH', `/v1/conversations/${conversationId}/messages/${seq}`, {
      body: { body },
    });
  }
  deleteMessage(conversationId, seq) {
    return this.call('DELETE', `/v1/conversations/${conversationId}/messages/${seq}`);
  }

  // ---- read state ----
  /** Moves the read watermark (forwards only, so retries are safe). */
  markRead(conversationId, seq) {
    return withRetry(() =>
      this.call('POST', `/v1/conversations/${conversationId}/read`, { body: { seq } }),
    );
  }
  receipts(conversationId, seq) {
    return this.call('GET', `/v1/conversations/${conversationId}/messages/${seq}/receipts`);
  }
}

// ---- the WebSocket ----

/** Close codes of the gateway (protocol.md, "Close codes"). */
const CLOSE_BAD_TOKEN = 4001;
const CLOSE_TOKEN_EXPIRED = 4002;
const CLOSE_REPLACED = 4008;

const BACKOFF_FIRST_MS = 500;
const BACKOFF_MAX_MS = 30000;
/** A connection that stayed up this long resets the backoff. */
const STABLE_AFTER_MS = 10000;
/** Renew the token this long before it expires, opening the new socket first. */
const RENEW_BEFORE_EXPIRY_MS = 5 * 60 * 1000;

/**
 * The gateway connection of one user.
 *
 * Callbacks:
 *   onFrame(frame)   every JSON frame the gateway pushes
 *   onState(state, detail)  'connecting' | 'online' | 'reconnecting' | 'replaced' | 'offline'
 *   onOpen()         after every (re)connection (catch up on its `ready` frame)
 */
export class Gateway {
  constructor(url, api, { onFrame, onState, onOpen }) {
    this.url = url;
    this.api = api;
    this.onFrame = onFrame;
    this.onState = onState;
    this.onOpen = onOpen;
    this.ws = null;
    this.stopped = true;
    this.failures = 0;
    this.retryTimer = null;
    this.renewTimer = null;
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.renewTimer);
    if (this.ws) this.ws.close(1000, 'signed out');
    this.ws = null;
    this.onState('offline');
  }

  /** Sends a frame if the socket is open; frames are never queued (acks are cumulative). */
  send(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  async connect() {
    clearTimeout(this.retryTimer);
    this.onState(this.failures === 0 ? 'connecting' : 'reconnecting');
    try {
      if (!this.api.token) await this.api.renewToken();
    } catch (err) {
      this.scheduleReconnect(`no token: ${err.message}`);
      return;
    }
    if (this.stopped) return;
    this.open();
  }

  /** Opens a socket; `previous` (when renewing) is closed once the new one is up. */
  open(previous = null) {
    const ws = new WebSocket(this.url, ['chatpipe.v1', `bearer.${this.api.token}`]);
    let openedAt = 0;
    this.ws = ws;

    ws.onopen = () => {
      if (ws !== this.ws) return;
      openedAt = Date.now();
      if (previous) previous.close(1000, 'renewed');
      this.onState('online');
      this.scheduleRenewal();
      this.onOpen();
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        return;
      }
      if (frame && typeof frame.type === 'string') this.onFrame(frame);
    };
    ws.onclose = (event) => {
      if (ws !== this.ws || this.stopped) return; // a replaced socket, or signed out
      if (!openedAt && previous && previous.readyState === WebSocket.OPEN) {
        this.ws = previous; // the renewal failed; keep the old socket until its 4002
        return;
      }
      this.ws = null;
      if (openedAt && Date.now() - openedAt > STABLE_AFTER_MS) this.failures = 0;
      this.handleClose(event);
    };
  }

  handleClose({ code, reason }) {
    if (code === CLOSE_REPLACED) {
      // A newer session of this user took our place: do not fight it.
      this.stopped = true;
      clearTimeout(this.renewTimer);
      this.onState('replaced', reason);
      return;
    }
    if (code === CLOSE_BAD_TOKEN || code === CLOSE_TOKEN_EXPIRED) {
      this.api.token = null; // connect() gets a new one
    }
    this.scheduleReconnect(`closed ${code}${reason ? `: ${reason}` : ''}`);
  }

  scheduleReconnect(why) {
    if (this.stopped) return;
    const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** this.failures);
    const delay = ceiling / 2 + Math.random() * (ceiling / 2); // jitter
    this.failures++;
    this.onState('reconnecting', `${why}; retrying in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  /** Before the token expires: new token, new socket, then close the old one (4002 never comes). */
  scheduleRenewal() {
    clearTimeout(this.renewTimer);
    const due = this.api.expiresAt - RENEW_BEFORE_EXPIRY_MS - Date.now();
    if (due <= 0 || due > 2 ** 31 - 1) return;
    this.renewTimer = setTimeout(async () => {
      if (this.stopped || !this.ws) return;
      try {
        await this.api.renewToken();
      } catch {
        return; // the old socket lives on; a 4002 reconnects later
      }
      if (!this.stopped && this.ws) this.open(this.ws);
    }, due);
  }
}
