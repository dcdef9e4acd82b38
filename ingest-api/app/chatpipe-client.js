// @chatpipe/client (clients/typescript), bundled by its `npm run bundle`: do not edit here.

// node_modules/openapi-fetch/dist/index.mjs
var PATH_PARAM_RE = /\{[^{}]+\}/g;
var supportsRequestInitExt = () => {
  return typeof process === "object" && Number.parseInt(process?.versions?.node?.substring(0, 2)) >= 18 && process.versions.undici;
};
function randomID() {
  return Math.random().toString(36).slice(2, 11);
}
function createClient(clientOptions) {
  let {
    baseUrl = "",
    Request: CustomRequest = globalThis.Request,
    fetch: baseFetch = globalThis.fetch,
    querySerializer: globalQuerySerializer,
    bodySerializer: globalBodySerializer,
    pathSerializer: globalPathSerializer,
    headers: baseHeaders,
    requestInitExt = void 0,
    ...baseOptions
  } = { ...clientOptions };
  requestInitExt = supportsRequestInitExt() ? requestInitExt : void 0;
  baseUrl = removeTrailingSlash(baseUrl);
  const globalMiddlewares = [];
  async function coreFetch(schemaPath, fetchOptions) {
    const {
      baseUrl: localBaseUrl,
      fetch = baseFetch,
      Request = CustomRequest,
      headers,
      params = {},
      parseAs = "json",
      querySerializer: requestQuerySerializer,
      bodySerializer = globalBodySerializer ?? defaultBodySerializer,
      pathSerializer: requestPathSerializer,
      body,
      middleware: requestMiddlewares = [],
      ...init
    } = fetchOptions || {};
    let finalBaseUrl = baseUrl;
    if (localBaseUrl) {
      finalBaseUrl = removeTrailingSlash(localBaseUrl) ?? baseUrl;
    }
    let querySerializer = typeof globalQuerySerializer === "function" ? globalQuerySerializer : createQuerySerializer(globalQuerySerializer);
    if (requestQuerySerializer) {
      querySerializer = typeof requestQuerySerializer === "function" ? requestQuerySerializer : createQuerySerializer({
        ...typeof globalQuerySerializer === "object" ? globalQuerySerializer : {},
        ...requestQuerySerializer
      });
    }
    const pathSerializer = requestPathSerializer || globalPathSerializer || defaultPathSerializer;
    const serializedBody = body === void 0 ? void 0 : bodySerializer(
      body,
      // Note: we declare mergeHeaders() both here and below because it’s a bit of a chicken-or-egg situation:
      // bodySerializer() needs all headers so we aren’t dropping ones set by the user, however,
      // the result of this ALSO sets the lowest-priority content-type header. So we re-merge below,
      // setting the content-type at the very beginning to be overwritten.
      // Lastly, based on the way headers work, it’s not a simple “present-or-not” check becauase null intentionally un-sets headers.
      mergeHeaders(baseHeaders, headers, params.header)
    );
    const finalHeaders = mergeHeaders(
      // with no body, we should not to set Content-Type
      serializedBody === void 0 || // if serialized body is FormData; browser will correctly set Content-Type & boundary expression
      serializedBody instanceof FormData ? {} : {
        "Content-Type": "application/json"
      },
      baseHeaders,
      headers,
      params.header
    );
    const finalMiddlewares = [...globalMiddlewares, ...requestMiddlewares];
    const requestInit = {
      redirect: "follow",
      ...baseOptions,
      ...init,
      body: serializedBody,
      headers: finalHeaders
    };
    let id;
    let options;
    let request = new Request(
      createFinalURL(schemaPath, { baseUrl: finalBaseUrl, params, querySerializer, pathSerializer }),
      requestInit
    );
    let response;
    for (const key in init) {
      if (!(key in request)) {
        request[key] = init[key];
      }
    }
    if (finalMiddlewares.length) {
      id = randomID();
      options = Object.freeze({
        baseUrl: finalBaseUrl,
        fetch,
        parseAs,
        querySerializer,
        bodySerializer,
        pathSerializer
      });
      for (const m of finalMiddlewares) {
        if (m && typeof m === "object" && typeof m.onRequest === "function") {
          const result = await m.onRequest({
            request,
            schemaPath,
            params,
            options,
            id
          });
          if (result) {
            if (result instanceof Request) {
              request = result;
            } else if (result instanceof Response) {
              response = result;
              break;
            } else {
              throw new Error("onRequest: must return new Request() or Response() when modifying the request");
            }
          }
        }
      }
    }
    if (!response) {
      try {
        response = await fetch(request, requestInitExt);
      } catch (error2) {
        let errorAfterMiddleware = error2;
        if (finalMiddlewares.length) {
          for (let i = finalMiddlewares.length - 1; i >= 0; i--) {
            const m = finalMiddlewares[i];
            if (m && typeof m === "object" && typeof m.onError === "function") {
              const result = await m.onError({
                request,
                error: errorAfterMiddleware,
                schemaPath,
                params,
                options,
                id
              });
              if (result) {
                if (result instanceof Response) {
                  errorAfterMiddleware = void 0;
                  response = result;
                  break;
                }
                if (result instanceof Error) {
                  errorAfterMiddleware = result;
                  continue;
                }
                throw new Error("onError: must return new Response() or instance of Error");
              }
            }
          }
        }
        if (errorAfterMiddleware) {
          throw errorAfterMiddleware;
        }
      }
      if (finalMiddlewares.length) {
        for (let i = finalMiddlewares.length - 1; i >= 0; i--) {
          const m = finalMiddlewares[i];
          if (m && typeof m === "object" && typeof m.onResponse === "function") {
            const result = await m.onResponse({
              request,
              response,
              schemaPath,
              params,
              options,
              id
            });
            if (result) {
              if (!(result instanceof Response)) {
                throw new Error("onResponse: must return new Response() when modifying the response");
              }
              response = result;
            }
          }
        }
      }
    }
    const contentLength = response.headers.get("Content-Length");
    if (response.status === 204 || request.method === "HEAD" || contentLength === "0" && !response.headers.get("Transfer-Encoding")?.includes("chunked")) {
      return response.ok ? { data: void 0, response } : { error: void 0, response };
    }
    if (response.ok) {
      const getResponseData = async () => {
        if (parseAs === "stream") {
          return response.body;
        }
        if (parseAs === "json" && !contentLength) {
          const raw = await response.text();
          return raw ? JSON.parse(raw) : void 0;
        }
        return await response[parseAs]();
      };
      return { data: await getResponseData(), response };
    }
    let error = await response.text();
    try {
      error = JSON.parse(error);
    } catch {
    }
    return { error, response };
  }
  return {
    request(method, url, init) {
      return coreFetch(url, { ...init, method: method.toUpperCase() });
    },
    /** Call a GET endpoint */
    GET(url, init) {
      return coreFetch(url, { ...init, method: "GET" });
    },
    /** Call a PUT endpoint */
    PUT(url, init) {
      return coreFetch(url, { ...init, method: "PUT" });
    },
    /** Call a POST endpoint */
    POST(url, init) {
      return coreFetch(url, { ...init, method: "POST" });
    },
    /** Call a DELETE endpoint */
    DELETE(url, init) {
      return coreFetch(url, { ...init, method: "DELETE" });
    },
    /** Call a OPTIONS endpoint */
    OPTIONS(url, init) {
      return coreFetch(url, { ...init, method: "OPTIONS" });
    },
    /** Call a HEAD endpoint */
    HEAD(url, init) {
      return coreFetch(url, { ...init, method: "HEAD" });
    },
    /** Call a PATCH endpoint */
    PATCH(url, init) {
      return coreFetch(url, { ...init, method: "PATCH" });
    },
    /** Call a TRACE endpoint */
    TRACE(url, init) {
      return coreFetch(url, { ...init, method: "TRACE" });
    },
    /** Register middleware */
    use(...middleware) {
      for (const m of middleware) {
        if (!m) {
          continue;
        }
        if (typeof m !== "object" || !("onRequest" in m || "onResponse" in m || "onError" in m)) {
          throw new Error("Middleware must be an object with one of `onRequest()`, `onResponse() or `onError()`");
        }
        globalMiddlewares.push(m);
      }
    },
    /** Unregister middleware */
    eject(...middleware) {
      for (const m of middleware) {
        const i = globalMiddlewares.indexOf(m);
        if (i !== -1) {
          globalMiddlewares.splice(i, 1);
        }
      }
    }
  };
}
function serializePrimitiveParam(name, value, options) {
  if (value === void 0 || value === null) {
    return "";
  }
  if (typeof value === "object") {
    throw new Error(
      "Deeply-nested arrays/objects aren\u2019t supported. Provide your own `querySerializer()` to handle these."
    );
  }
  return `${name}=${options?.allowReserved === true ? value : encodeURIComponent(value)}`;
}
function serializeObjectParam(name, value, options) {
  if (!value || typeof value !== "object") {
    return "";
  }
  const values = [];
  const joiner = {
    simple: ",",
    label: ".",
    matrix: ";"
  }[options.style] || "&";
  if (options.style !== "deepObject" && options.explode === false) {
    for (const k in value) {
      values.push(k, options.allowReserved === true ? value[k] : encodeURIComponent(value[k]));
    }
    const final2 = values.join(",");
    switch (options.style) {
      case "form": {
        return `${name}=${final2}`;
      }
      case "label": {
        return `.${final2}`;
      }
      case "matrix": {
        return `;${name}=${final2}`;
      }
      default: {
        return final2;
      }
    }
  }
  for (const k in value) {
    const finalName = options.style === "deepObject" ? `${name}[${k}]` : k;
    values.push(serializePrimitiveParam(finalName, value[k], options));
  }
  const final = values.join(joiner);
  return options.style === "label" || options.style === "matrix" ? `${joiner}${final}` : final;
}
function serializeArrayParam(name, value, options) {
  if (!Array.isArray(value)) {
    return "";
  }
  if (options.explode === false) {
    const joiner2 = { form: ",", spaceDelimited: "%20", pipeDelimited: "|" }[options.style] || ",";
    const final = (options.allowReserved === true ? value : value.map((v) => encodeURIComponent(v))).join(joiner2);
    switch (options.style) {
      case "simple": {
        return final;
      }
      case "label": {
        return `.${final}`;
      }
      case "matrix": {
        return `;${name}=${final}`;
      }
      // case "spaceDelimited":
      // case "pipeDelimited":
      default: {
        return `${name}=${final}`;
      }
    }
  }
  const joiner = { simple: ",", label: ".", matrix: ";" }[options.style] || "&";
  const values = [];
  for (const v of value) {
    if (options.style === "simple" || options.style === "label") {
      values.push(options.allowReserved === true ? v : encodeURIComponent(v));
    } else {
      values.push(serializePrimitiveParam(name, v, options));
    }
  }
  return options.style === "label" || options.style === "matrix" ? `${joiner}${values.join(joiner)}` : values.join(joiner);
}
function createQuerySerializer(options) {
  return function querySerializer(queryParams) {
    const search = [];
    if (queryParams && typeof queryParams === "object") {
      for (const name in queryParams) {
        const value = queryParams[name];
        if (value === void 0 || value === null) {
          continue;
        }
        if (Array.isArray(value)) {
          if (value.length === 0) {
            continue;
          }
          search.push(
            serializeArrayParam(name, value, {
              style: "form",
              explode: true,
              ...options?.array,
              allowReserved: options?.allowReserved || false
            })
          );
          continue;
        }
        if (typeof value === "object") {
          search.push(
            serializeObjectParam(name, value, {
              style: "deepObject",
              explode: true,
              ...options?.object,
              allowReserved: options?.allowReserved || false
            })
          );
          continue;
        }
        search.push(serializePrimitiveParam(name, value, options));
      }
    }
    return search.join("&");
  };
}
function defaultPathSerializer(pathname, pathParams) {
  let nextURL = pathname;
  for (const match of pathname.match(PATH_PARAM_RE) ?? []) {
    let name = match.substring(1, match.length - 1);
    let explode = false;
    let style = "simple";
    if (name.endsWith("*")) {
      explode = true;
      name = name.substring(0, name.length - 1);
    }
    if (name.startsWith(".")) {
      style = "label";
      name = name.substring(1);
    } else if (name.startsWith(";")) {
      style = "matrix";
      name = name.substring(1);
    }
    if (!pathParams || pathParams[name] === void 0 || pathParams[name] === null) {
      continue;
    }
    const value = pathParams[name];
    if (Array.isArray(value)) {
      nextURL = nextURL.replace(match, serializeArrayParam(name, value, { style, explode }));
      continue;
    }
    if (typeof value === "object") {
      nextURL = nextURL.replace(match, serializeObjectParam(name, value, { style, explode }));
      continue;
    }
    if (style === "matrix") {
      nextURL = nextURL.replace(match, `;${serializePrimitiveParam(name, value)}`);
      continue;
    }
    nextURL = nextURL.replace(match, style === "label" ? `.${encodeURIComponent(value)}` : encodeURIComponent(value));
  }
  return nextURL;
}
function defaultBodySerializer(body, headers) {
  if (body instanceof FormData) {
    return body;
  }
  if (headers) {
    const contentType = headers.get instanceof Function ? headers.get("Content-Type") ?? headers.get("content-type") : headers["Content-Type"] ?? headers["content-type"];
    if (contentType === "application/x-www-form-urlencoded") {
      return new URLSearchParams(body).toString();
    }
  }
  return JSON.stringify(body);
}
function createFinalURL(pathname, options) {
  let finalURL = `${options.baseUrl}${pathname}`;
  if (options.params?.path) {
    finalURL = options.pathSerializer(finalURL, options.params.path);
  }
  let search = options.querySerializer(options.params.query ?? {});
  if (search.startsWith("?")) {
    search = search.substring(1);
  }
  if (search) {
    finalURL += `?${search}`;
  }
  return finalURL;
}
function mergeHeaders(...allHeaders) {
  const finalHeaders = new Headers();
  for (const h of allHeaders) {
    if (!h || typeof h !== "object") {
      continue;
    }
    const iterator = h instanceof Headers ? h.entries() : Object.entries(h);
    for (const [k, v] of iterator) {
      if (v === null) {
        finalHeaders.delete(k);
      } else if (Array.isArray(v)) {
        for (const v2 of v) {
          finalHeaders.append(k, v2);
        }
      } else if (v !== void 0) {
        finalHeaders.set(k, v);
      }
    }
  }
  return finalHeaders;
}
function removeTrailingSlash(url) {
  if (url.endsWith("/")) {
    return url.substring(0, url.length - 1);
  }
  return url;
}

// src/problem.ts
var ProblemError = class _ProblemError extends Error {
  /** `/problems/<code>`, e.g. `/problems/not-a-member`. */
  type;
  /** The last segment of `type`, e.g. `not-a-member`. */
  code;
  status;
  title;
  detail;
  /** The JSON path, query parameter or path segment at fault, if one is. */
  field;
  /** The request's `x-request-id`. */
  requestId;
  /** Seconds to wait before trying again (`Retry-After` of a 429 or 503), if given. */
  retryAfter;
  constructor(problem, retryAfter = null) {
    super(`${problem.status} ${problem.type}: ${problem.detail}`);
    this.name = "ProblemError";
    this.type = problem.type;
    this.code = problem.type.split("/").pop() ?? problem.type;
    this.status = problem.status;
    this.title = problem.title;
    this.detail = problem.detail;
    this.field = problem.field ?? null;
    this.requestId = problem.requestId ?? null;
    this.retryAfter = retryAfter;
  }
  /** The problem an error response carries (a body that is not a problem still gives one). */
  static async of(response) {
    const header = response.headers.get("retry-after");
    const seconds = header === null ? NaN : Number(header);
    const retryAfter = Number.isFinite(seconds) ? seconds : null;
    const text = await response.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
    if (isProblem(body)) return new _ProblemError(body, retryAfter);
    return new _ProblemError(
      {
        type: `/problems/http-${response.status}`,
        title: response.statusText,
        status: response.status,
        detail: text.slice(0, 200),
        requestId: response.headers.get("x-request-id")
      },
      retryAfter
    );
  }
};
function isProblem(body) {
  if (typeof body !== "object" || body === null) return false;
  const b = body;
  return typeof b.type === "string" && typeof b.status === "number";
}

// src/rest.ts
var Rest = class {
  raw;
  token;
  constructor(options) {
    this.token = options.token;
    this.raw = createClient({
      baseUrl: options.baseUrl.replace(/\/$/, ""),
      fetch: options.fetch ?? ((request) => globalThis.fetch(request))
    });
    this.raw.use({
      onRequest: async ({ request }) => {
        request.headers.set("authorization", `Bearer ${await this.token({ refresh: false })}`);
        return request;
      },
      onResponse: async ({ response }) => {
        if (!response.ok) throw await ProblemError.of(response);
        return response;
      }
    });
  }
  /** Sends a message. Retrying with the same `clientMsgId` never sends it twice. */
  async send(conversationId, message) {
    const { data } = await this.raw.POST("/v1/conversations/{id}/messages", {
      params: { path: { id: conversationId } },
      body: message
    });
    return data;
  }
  /** A page of history: after `afterSeq` (oldest first) or before `beforeSeq`. */
  async history(conversationId, query = {}) {
    const { data } = await this.raw.GET("/v1/conversations/{id}/messages", {
      params: { path: { id: conversationId }, query }
    });
    return data;
  }
  /** Every conversation changed since `since` (a `nextCursor`), once each. */
  async sync(since, limit) {
    const { data } = await this.raw.GET("/v1/sync", { params: { query: { since, limit } } });
    return data;
  }
  async inbox() {
    const { data } = await this.raw.GET("/v1/inbox");
    return data;
  }
  /** A group with these members (the caller is added). `idempotencyKey`: a retry makes no second group. */
  async createGroup(memberIds, options = {}) {
    const { data } = await this.raw.POST("/v1/conversations", {
      body: { type: "GROUP", memberIds, title: options.title },
      headers: options.idempotencyKey ? { "idempotency-key": options.idempotencyKey } : {}
    });
    return data;
  }
  /**
   * Marks the conversation read up to `seq`: 200 with the outcome when applied at once,
   * 202 with the accepted seq when the stream path applies it within a moment.
   */
  async markRead(conversationId, seq) {
    const { data } = await this.raw.POST("/v1/conversations/{id}/read", {
      params: { path: { id: conversationId } },
      body: { seq }
    });
    return data;
  }
};

// src/gateway.ts
var SUBPROTOCOL = "chatpipe.v1";
var CloseCode = {
  GoingAway: 1001,
  Overflow: 1008,
  TryAgainLater: 1013,
  Unauthorized: 4001,
  TokenExpired: 4002,
  Replaced: 4008
};
var STABLE_AFTER_MS = 1e4;
var Gateway = class {
  options;
  Socket;
  ws = null;
  stopped = true;
  failures = 0;
  refresh = false;
  retryTimer;
  renewTimer;
  constructor(options) {
    this.options = {
      firstBackoffMs: 500,
      maxBackoffMs: 3e4,
      renewBeforeExpiryMs: 5 * 6e4,
      ...options
    };
    const Socket = options.WebSocket ?? globalThis.WebSocket;
    if (!Socket) throw new Error("no WebSocket class: pass one (options.WebSocket)");
    this.Socket = Socket;
  }
  start() {
    this.stopped = false;
    void this.connect();
  }
  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.renewTimer);
    this.ws?.close(1e3, "stopped");
    this.ws = null;
    this.options.onState?.("stopped");
  }
  /** Sends `ack` or `typing` if the socket is open (never queued: acks are cumulative). */
  send(frame) {
    if (this.ws?.readyState !== this.Socket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
  async connect(previous = null) {
    clearTimeout(this.retryTimer);
    if (!previous) this.options.onState?.(this.failures === 0 ? "connecting" : "reconnecting");
    let token;
    try {
      token = await this.options.token({ refresh: this.refresh });
      this.refresh = false;
    } catch (err) {
      if (!previous) this.retry(`no token: ${err.message}`);
      return;
    }
    if (!this.stopped) this.open(token, previous);
  }
  /** Opens a socket; `previous` (a renewal) is closed once the new one is open. */
  open(token, previous) {
    const ws = new this.Socket(this.options.url, [SUBPROTOCOL, `bearer.${token}`]);
    let openedAt = 0;
    this.ws = ws;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      openedAt = Date.now();
      previous?.close(1e3, "renewed");
      this.options.onState?.("open");
      this.scheduleRenewal(token);
    };
    ws.onmessage = (event) => {
      if (ws !== this.ws) return;
      let frame;
      try {
        frame = JSON.parse(String(event.data));
      } catch {
        return;
      }
      if (typeof frame?.type !== "string") return;
      if (frame.type === "ready") {
        this.options.onState?.("ready");
        this.options.onCatchUp?.(frame);
      } else if (frame.type === "resync") {
        this.options.onCatchUp?.({ type: "resync", reason: String(frame.reason) });
      }
      this.options.onFrame?.(frame);
    };
    let ended = false;
    const end = (code, reason) => {
      if (ended) return;
      ended = true;
      if (ws !== this.ws || this.stopped) return;
      if (!openedAt && previous?.readyState === this.Socket.OPEN) {
        this.ws = previous;
        return;
      }
      this.ws = null;
      if (openedAt && Date.now() - openedAt > STABLE_AFTER_MS) this.failures = 0;
      this.closed(code, reason);
    };
    ws.onclose = (event) => end(event.code, event.reason);
    ws.onerror = () => end(1006, "connection failed");
  }
  closed(code, reason) {
    if (code === CloseCode.Replaced) {
      this.stopped = true;
      clearTimeout(this.renewTimer);
      this.options.onState?.("replaced", reason);
      return;
    }
    if (code === CloseCode.Unauthorized || code === CloseCode.TokenExpired) this.refresh = true;
    this.retry(`closed ${code}${reason ? `: ${reason}` : ""}`);
  }
  retry(why) {
    if (this.stopped) return;
    const { firstBackoffMs, maxBackoffMs } = this.options;
    const ceiling = Math.min(maxBackoffMs, firstBackoffMs * 2 ** this.failures);
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.failures++;
    this.options.onState?.("reconnecting", `${why}; retrying in ${(delay / 1e3).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => void this.connect(), delay);
  }
  /** A little before the token's `exp`: a new token, a new socket, then the old one closes. */
  scheduleRenewal(token) {
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
};
function expiresAtMs(jwt) {
  const payload = jwt.split(".")[1];
  if (!payload) return null;
  try {
    const json = JSON.parse(atob(payload.replace(/-/g, "+").replace(/_/g, "/")));
    return typeof json.exp === "number" ? json.exp * 1e3 : null;
  } catch {
    return null;
  }
}

// src/outbox.ts
var PENDING_KEY = "chatpipe.pending";
var Outbox = class {
  constructor(options) {
    this.options = options;
  }
  options;
  pending = [];
  pumping = false;
  closed = false;
  retryTimer;
  /** Loads what was pending and sends it. */
  async open() {
    const saved = await this.options.storage.get(PENDING_KEY);
    this.pending = saved ? JSON.parse(saved) : [];
    this.pump();
  }
  /** Stops sending; what is pending stays stored. */
  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
  }
  async add(send) {
    const p = {
      ...send,
      clientMsgId: crypto.randomUUID(),
      queuedAt: (/* @__PURE__ */ new Date()).toISOString()
    };
    this.pending.push(p);
    await this.save();
    this.pump();
    return p;
  }
  /** A push carried this `clientMsgId`: it is committed, whatever its answer does. */
  async pushed(clientMsgId) {
    const before = this.pending.length;
    this.pending = this.pending.filter((p) => p.clientMsgId !== clientMsgId);
    if (this.pending.length !== before) await this.save();
  }
  /** Sends what is pending, oldest first, one at a time; a no-op while it runs. */
  pump() {
    if (this.pumping || this.closed) return;
    this.pumping = true;
    void (async () => {
      let attempt = 0;
      for (; ; ) {
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
  async deliver(p, attempt) {
    let sent;
    try {
      sent = await this.options.rest.send(p.conversationId, {
        clientMsgId: p.clientMsgId,
        body: p.body,
        threadRootSeq: p.threadRootSeq
      });
    } catch (err) {
      if (err instanceof ProblemError && err.status < 500 && err.status !== 429 && err.status !== 408) {
        p.refused = { type: err.type, detail: err.detail };
        await this.save();
        this.options.refused(p);
        return null;
      }
      const first = this.options.firstRetryMs ?? 500;
      const ceiling = Math.min(this.options.maxRetryMs ?? 3e4, first * 2 ** attempt);
      const asked = err instanceof ProblemError && err.retryAfter !== null ? err.retryAfter * 1e3 : 0;
      return Math.max(asked, ceiling / 2 + Math.random() * (ceiling / 2));
    }
    await this.pushed(p.clientMsgId);
    await this.options.committed(p, sent);
    return null;
  }
  async save() {
    await this.options.storage.set(PENDING_KEY, JSON.stringify(this.pending));
  }
};

// src/storage.ts
var MemoryStorage = class {
  values = /* @__PURE__ */ new Map();
  async get(key) {
    return this.values.get(key) ?? null;
  }
  async set(key, value) {
    this.values.set(key, value);
  }
  async delete(key) {
    this.values.delete(key);
  }
};
var IndexedDbStorage = class {
  db;
  constructor(name = "chatpipe") {
    this.db = new Promise((resolve, reject) => {
      const open = indexedDB.open(name, 1);
      open.onupgradeneeded = () => open.result.createObjectStore("kv");
      open.onsuccess = () => resolve(open.result);
      open.onerror = () => reject(open.error);
    });
  }
  async run(mode, op) {
    const db = await this.db;
    return new Promise((resolve, reject) => {
      const request = op(db.transaction("kv", mode).objectStore("kv"));
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  }
  async get(key) {
    const value = await this.run("readonly", (kv) => kv.get(key));
    return typeof value === "string" ? value : null;
  }
  async set(key, value) {
    await this.run("readwrite", (kv) => kv.put(value, key));
  }
  async delete(key) {
    await this.run("readwrite", (kv) => kv.delete(key));
  }
};

// src/store.ts
var STATE_KEY = "chatpipe.state";
var ConversationStore = class {
  constructor(options) {
    this.options = options;
    this.storage = options.storage ?? new MemoryStorage();
    this.outbox = new Outbox({
      rest: options.rest,
      storage: this.storage,
      firstRetryMs: options.firstRetryMs,
      maxRetryMs: options.maxRetryMs,
      committed: (p, sent) => this.sent(p, sent),
      refused: (p) => this.options.onChange?.(p.conversationId)
    });
  }
  options;
  conversations = /* @__PURE__ */ new Map();
  cursor;
  storage;
  outbox;
  catchingUp = Promise.resolve();
  /** Loads what the storage holds and sends what was pending when it was saved. */
  async open() {
    const state = await this.storage.get(STATE_KEY);
    if (state) {
      const saved = JSON.parse(state);
      this.cursor = saved.cursor;
      this.conversations = new Map(saved.conversations.map((c) => [c.conversationId, c]));
    }
    await this.outbox.open();
  }
  /** Stops retrying (what is pending stays in the storage). */
  close() {
    this.outbox.close();
  }
  conversation(id) {
    return this.conversations.get(id);
  }
  /** The conversation's messages, by seq. */
  messages(id) {
    const c = this.conversations.get(id);
    return c ? Object.values(c.messages).sort((a, b) => a.seq - b.seq) : [];
  }
  /** Sends not yet committed, oldest first, and those the API refused (`refused`). */
  pendingSends() {
    return this.outbox.pending;
  }
  /**
   * Everything that changed since the last catch-up (the sync cursor chain), one at a
   * time: a second call while one runs waits for it and runs after. Never rejects: a
   * failure goes to `onError`.
   */
  catchUp() {
    this.catchingUp = this.catchingUp.then(() => this.sync()).catch((err) => this.failed(err));
    return this.catchingUp;
  }
  failed(err) {
    (this.options.onError ?? ((e) => console.warn("chatpipe store:", e)))(err);
  }
  async sync() {
    let since = this.cursor;
    for (; ; ) {
      let page;
      try {
        page = await this.options.rest.sync(since);
      } catch (err) {
        if (err instanceof ProblemError && err.code === "cursor-stale" && since !== void 0) {
          since = void 0;
          this.conversations.clear();
          continue;
        }
        throw err;
      }
      for (const entry of page.conversations) {
        if ("left" in entry && entry.left) {
          this.conversations.delete(entry.conversationId);
          this.options.onChange?.(null);
        } else {
          await this.applyChanged(entry);
        }
      }
      since = page.nextCursor;
      if (!page.hasMore) break;
    }
    this.cursor = since;
    await this.save();
  }
  async applyChanged(entry) {
    const c = this.held(entry.conversationId);
    const before = highest(c);
    c.lastSeq = Math.max(c.lastSeq, entry.lastSeq);
    c.lastReadSeq = Math.max(c.lastReadSeq, entry.lastReadSeq);
    c.title = entry.title;
    for (const m of entry.messages) this.put(c, fromHistory(m));
    const first = entry.messages[0]?.seq ?? c.lastSeq + 1;
    if (entry.hasMore || first > before + 1) await this.fill(c, before);
    this.options.onChange?.(c.conversationId);
  }
  /** A frame from the gateway. Never rejects: a failed fill goes to `onError`. */
  async apply(frame) {
    try {
      await this.applyFrame(frame);
    } catch (err) {
      this.failed(err);
    }
  }
  async applyFrame(frame) {
    switch (frame.type) {
      case "message.new":
        return this.onNew(frame);
      case "message.edited":
        return this.onEdited(frame);
      case "message.deleted":
        return this.onDeleted(frame);
      case "read.updated": {
        const r = frame;
        const c = this.conversations.get(r.conversationId);
        if (c && (r.userId === this.options.userId || r.light)) {
          c.lastReadSeq = Math.max(c.lastReadSeq, r.lastReadSeq);
          this.options.onChange?.(c.conversationId);
        }
        return;
      }
      default:
    }
  }
  async onNew(f) {
    const c = this.held(f.conversationId);
    if (c.messages[f.seq]) return;
    const before = highest(c);
    c.lastSeq = Math.max(c.lastSeq, f.seq);
    if (f.light || f.body === void 0 || f.senderId === void 0) {
      await this.fill(c, before);
    } else {
      if (f.seq > before + 1) await this.fill(c, before, f.seq - 1);
      this.put(c, {
        seq: f.seq,
        senderId: f.senderId,
        clientMsgId: f.clientMsgId ?? "",
        createdAt: f.createdAt ?? (/* @__PURE__ */ new Date()).toISOString(),
        body: f.body,
        threadRootSeq: f.threadRootSeq ?? null,
        mentions: f.mentions
      });
    }
    if (f.clientMsgId) await this.outbox.pushed(f.clientMsgId);
    this.options.onChange?.(c.conversationId);
    await this.save();
  }
  async onEdited(f) {
    const c = this.held(f.conversationId);
    const m = c.messages[f.seq];
    if (f.light || f.body === void 0) {
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
  async onDeleted(f) {
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
  send(conversationId, body, options = {}) {
    return this.outbox.add({ conversationId, body, threadRootSeq: options.threadRootSeq });
  }
  /** The outbox committed `p` as `sent`: the store holds it from now on. */
  async sent(p, sent) {
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
        threadRootSeq: sent.threadRootSeq ?? null
      });
    }
    this.options.onChange?.(p.conversationId);
    await this.save();
  }
  /** Fetches the messages after `after` (up to `until`, or the end) into `c`. */
  async fill(c, after, until = Infinity) {
    let from = after;
    for (; ; ) {
      const page = await this.options.rest.history(c.conversationId, {
        afterSeq: from,
        limit: this.options.pageSize ?? 100
      });
      for (const m of page.messages) if (m.seq <= until) this.put(c, fromHistory(m));
      c.lastSeq = Math.max(c.lastSeq, page.lastSeq);
      const last = page.messages.at(-1)?.seq;
      if (!page.hasMore || last === void 0 || last >= until) return;
      from = last;
    }
  }
  async refetch(c, seq) {
    const page = await this.options.rest.history(c.conversationId, { afterSeq: seq - 1, limit: 1 });
    for (const m of page.messages) if (m.seq === seq) this.put(c, fromHistory(m));
  }
  /** Puts a message as history or a push has it: a deleted one stays deleted; early changes apply. */
  put(c, m) {
    const held = c.messages[m.seq];
    const early = c.early[m.seq];
    delete c.early[m.seq];
    const deleted = Boolean(held?.deleted || m.deleted || early?.deleted);
    const edited = early?.body !== void 0 && !m.editedAt ? early : void 0;
    const newer = held?.editedAt && time(held.editedAt) > time(m.editedAt) ? held : void 0;
    c.messages[m.seq] = {
      ...m,
      body: deleted ? null : edited?.body ?? newer?.body ?? m.body,
      editedAt: edited?.editedAt ?? newer?.editedAt ?? m.editedAt ?? null,
      deleted: deleted || void 0
    };
    c.lastSeq = Math.max(c.lastSeq, m.seq);
  }
  held(id) {
    let c = this.conversations.get(id);
    if (!c) {
      c = { conversationId: id, lastSeq: 0, lastReadSeq: 0, messages: {}, early: {} };
      this.conversations.set(id, c);
    }
    return c;
  }
  async save() {
    const state = { cursor: this.cursor, conversations: [...this.conversations.values()] };
    await this.storage.set(STATE_KEY, JSON.stringify(state));
  }
};
function time(at) {
  return at ? Date.parse(at) : -Infinity;
}
function highest(c) {
  let seq = c.contiguous ?? 0;
  while (c.messages[seq + 1]) seq++;
  c.contiguous = seq;
  return seq;
}
function fromHistory(m) {
  return {
    seq: m.seq,
    senderId: m.senderId,
    clientMsgId: m.clientMsgId,
    createdAt: m.createdAt,
    body: m.deleted ? null : m.body ?? null,
    editedAt: m.editedAt ?? null,
    deleted: m.deleted || void 0,
    threadRootSeq: m.threadRootSeq ?? null,
    mentions: m.mentions
  };
}
export {
  CloseCode,
  ConversationStore,
  Gateway,
  IndexedDbStorage,
  MemoryStorage,
  Outbox,
  ProblemError,
  Rest,
  SUBPROTOCOL
};
