// chatpipe browser client: talking to the servers, through the chatpipe client package
// (clients/typescript, bundled into chatpipe-client.js):
//
//   Api       the REST API for one signed-in user: the package's typed Rest, with the
//             demo token as its token provider (renewed on a 401)
//   Gateway   the package's WebSocket connection, with the same token provider
//
// Nothing here touches the page; app.js owns state and rendering.
// docs/api.md and docs/protocol.md describe every call and frame used here.

import { Gateway as Connection, ProblemError, Rest } from './chatpipe-client.js';

/** A refused REST call: the package's ProblemError (`status`, `type`, `field`, `retryAfter`). */
export { ProblemError as ApiError };

/** Whether a failed call may be tried again with the same clientMsgId. */
function isRetryable(err) {
  // No answer at all (fetch failed), or 429: over the rate limit; 503: not written or
  // not answered in time; 500: nothing was committed. The clientMsgId makes every retry
  // safe (api.md, "send").
  return !(err instanceof ProblemError) || [429, 500, 503].includes(err.status);
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
      await sleep(err.retryAfter ? err.retryAfter * 1000 : delay);
      delay = Math.min(delay * 2, 8000);
    }
  }
}

// ---- demo endpoints (exist only when ingest-api runs with demo.enabled) ----

async function demo(method, path, body) {
  const response = await fetch(new URL(path, location.origin), {
    method,
    headers: body === undefined ? {} : { 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await ProblemError.of(response);
  return response.json();
}

/** `POST /demo/token`: a token for any user id. */
export function demoToken(userId) {
  return demo('POST', '/demo/token', { userId });
}

/** `GET /demo/config`: `{gatewayUrl}`. */
export function demoConfig() {
  return demo('GET', '/demo/config');
}

/** The REST API as one user. */
export class Api {
  constructor(userId) {
    this.userId = userId;
    this.token = null;
    this.expiresAt = 0; // ms since epoch
    this.renewing = null;
    /** The token provider of the package's Rest and Gateway. */
    this.tokens = ({ refresh }) => (refresh || !this.token ? this.renewToken() : this.token);
    this.rest = new Rest({ baseUrl: location.origin, token: this.tokens });
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

  /** One call of the typed client (`raw`); a 401 renews the token and tries once more. */
  async call(op) {
    const once = async () => (await op(this.rest.raw)).data ?? null;
    try {
      return await once();
    } catch (err) {
      if (!(err instanceof ProblemError) || err.status !== 401) throw err;
      await this.renewToken();
      return once();
    }
  }

  // ---- conversations ----
  inbox(cursor, limit) {
    return this.call((api) => api.GET('/v1/inbox', { params: { query: { cursor, limit } } }));
  }
  sync(since, limit) {
    return this.call((api) => api.GET('/v1/sync', { params: { query: { since, limit } } }));
  }
  openDirect(peerId) {
    return this.call((api) => api.POST('/v1/direct', { body: { peerId } }));
  }
  createGroup(title, memberIds) {
    const body = { type: 'GROUP', memberIds };
    if (title) body.title = title;
    return this.call((api) => api.POST('/v1/conversations', { body }));
  }
  members(conversationId) {
    const path = { id: conversationId };
    return this.call((api) => api.GET('/v1/conversations/{id}/members', { params: { path } }));
  }

  // ---- messages ----
  /** `{beforeSeq}` pages back, `{afterSeq}` fills a gap, neither gives the newest. */
  history(conversationId, { beforeSeq, afterSeq, limit } = {}) {
    return this.call((api) =>
      api.GET('/v1/conversations/{id}/messages', {
        params: { path: { id: conversationId }, query: { beforeSeq, afterSeq, limit } },
      }),
    );
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
      this.call((api) =>
        api.POST('/v1/conversations/{id}/messages', {
          params: { path: { id: conversationId } },
          body: payload,
        }),
      ),
    );
  }

  // ---- threads (replies) ----
  /** The replies of thread `rootSeq`, ascending, from `afterSeq` on (`hasMore`: page on). */
  threadReplies(conversationId, rootSeq, afterSeq = 0, limit = 200) {
    return this.call((api) =>
      api.GET('/v1/conversations/{id}/messages', {
        params: { path: { id: conversationId }, query: { threadRootSeq: rootSeq, afterSeq, limit } },
      }),
    );
  }

  /** Marks thread `rootSeq` read up to `seq` (forwards only, so retries are safe). */
  readThread(conversationId, rootSeq, seq) {
    const path = { id: conversationId, rootSeq };
    return withRetry(() =>
      this.call((api) =>
        api.POST('/v1/conversations/{id}/threads/{rootSeq}/read', { params: { path }, body: { seq } }),
      ),
    );
  }

  /** Follows thread `rootSeq` (or, with `follow` false, stops): `{lastReadSeq, following, unreadThreads}`. */
  followThread(conversationId, rootSeq, follow = true) {
    const path = { id: conversationId, rootSeq };
    return this.call((api) =>
      (follow ? api.PUT : api.DELETE)('/v1/conversations/{id}/threads/{rootSeq}/follow', {
        params: { path },
      }),
    );
  }

  /** Adds (or, with `remove`, takes back) the caller's reaction `key` to a message. */
  react(conversationId, seq, key, remove = false) {
    const path = { id: conversationId, seq, key };
    return this.call((api) =>
      (remove ? api.DELETE : api.PUT)('/v1/conversations/{id}/messages/{seq}/reactions/{key}', {
        params: { path },
      }),
    );
  }

  /** `level`: all | mentions | none. */
  setNotifications(conversationId, level) {
    return this.call((api) =>
      api.PUT('/v1/conversations/{id}/notifications', {
        params: { path: { id: conversationId } },
        body: { level },
      }),
    );
  }

  editMessage(conversationId, seq, body) {
    return this.call((api) =>
      api.PATCH('/v1/conversations/{id}/messages/{seq}', {
        params: { path: { id: conversationId, seq } },
        body: { body },
      }),
    );
  }
  deleteMessage(conversationId, seq) {
    return this.call((api) =>
      api.DELETE('/v1/conversations/{id}/messages/{seq}', {
        params: { path: { id: conversationId, seq } },
      }),
    );
  }

  // ---- read state ----
  /** Moves the read watermark (forwards only, so retries are safe). */
  markRead(conversationId, seq) {
    return withRetry(() =>
      this.call((api) =>
        api.POST('/v1/conversations/{id}/read', {
          params: { path: { id: conversationId } },
          body: { seq },
        }),
      ),
    );
  }
  receipts(conversationId, seq) {
    return this.call((api) =>
      api.GET('/v1/conversations/{id}/messages/{seq}/receipts', {
        params: { path: { id: conversationId, seq } },
      }),
    );
  }
}

// ---- the WebSocket ----

/**
 * The gateway connection of one user: the package's, with the demo token. It renews
 * the token before it expires (a new socket first), reconnects with backoff and jitter,
 * and stops when a newer session of the user replaces it.
 *
 * Callbacks:
 *   onFrame(frame)   every JSON frame the gateway pushes (`ready`: catch up now)
 *   onState(state, detail)  'connecting' | 'online' | 'reconnecting' | 'replaced' | 'offline'
 *   onOpen()         after every (re)connection
 */
export class Gateway {
  constructor(url, api, { onFrame, onState, onOpen }) {
    this.connection = new Connection({
      url,
      token: api.tokens,
      onFrame,
      onState: (state, detail = '') => {
        if (state === 'ready') return; // onFrame has the frame
        onState({ open: 'online', stopped: 'offline' }[state] ?? state, detail);
        if (state === 'open') onOpen();
      },
    });
  }

  start() {
    this.connection.start();
  }

  stop() {
    this.connection.stop();
  }

  /** Sends a frame if the socket is open; frames are never queued (acks are cumulative). */
  send(frame) {
    return this.connection.send(frame);
  }
}
