/**
 * The REST API, every operation typed from docs/openapi.json (generated into
 * `openapi.ts` by openapi-typescript, called through openapi-fetch). An error answer
 * throws a {@link ProblemError}; a success gives its body.
 */
import createClient, { type Client } from 'openapi-fetch';

import type { components, paths } from './openapi.js';
import { ProblemError } from './problem.js';

/** The API's schemas by name: `Schemas['SentMessage']`, `Schemas['SyncPage']`, … */
export type Schemas = components['schemas'];

/**
 * Gives the caller's JWT. `refresh` is true when the last one was refused or has
 * expired: get a new one then (from your login service; chatpipe never mints tokens
 * outside demo mode).
 */
export type TokenProvider = (options: { refresh: boolean }) => string | Promise<string>;

export interface RestOptions {
  /** Where ingest-api answers, e.g. `https://chat.example.com` (paths start with /v1). */
  baseUrl: string;
  token: TokenProvider;
  /** A fetch of your own (tests, proxies); the global one otherwise. */
  fetch?: typeof globalThis.fetch;
}

/**
 * The REST API of one user: `raw` is the typed openapi-fetch client for every
 * operation; the methods below are the ones every chat client needs, with their
 * arguments named.
 */
export class Rest {
  readonly raw: Client<paths>;
  private readonly token: TokenProvider;

  constructor(options: RestOptions) {
    this.token = options.token;
    this.raw = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/$/, ''),
      fetch: options.fetch ?? ((request: Request) => globalThis.fetch(request)),
    });
    this.raw.use({
      onRequest: async ({ request }) => {
        request.headers.set('authorization', `Bearer ${await this.token({ refresh: false })}`);
        return request;
      },
      onResponse: async ({ response }) => {
        if (!response.ok) throw await ProblemError.of(response);
        return response;
      },
    });
  }

  /** Sends a message. Retrying with the same `clientMsgId` never sends it twice. */
  async send(
    conversationId: number,
    message: Schemas['SendMessage'],
  ): Promise<Schemas['SentMessage']> {
    const { data } = await this.raw.POST('/v1/conversations/{id}/messages', {
      params: { path: { id: conversationId } },
      body: message,
    });
    return data!;
  }

  /** A page of history: after `afterSeq` (oldest first) or before `beforeSeq`. */
  async history(
    conversationId: number,
    query: { afterSeq?: number; beforeSeq?: number; limit?: number } = {},
  ): Promise<Schemas['HistoryPage']> {
    const { data } = await this.raw.GET('/v1/conversations/{id}/messages', {
      params: { path: { id: conversationId }, query },
    });
    return data!;
  }

  /** Every conversation changed since `since` (a `nextCursor`), once each. */
  async sync(since?: string, limit?: number): Promise<Schemas['SyncPage']> {
    const { data } = await this.raw.GET('/v1/sync', { params: { query: { since, limit } } });
    return data!;
  }

  async inbox(): Promise<Schemas['InboxPage']> {
    const { data } = await this.raw.GET('/v1/inbox');
    return data!;
  }

  /** A group with these members (the caller is added). `idempotencyKey`: a retry makes no second group. */
  async createGroup(
    memberIds: number[],
    options: { title?: string; idempotencyKey?: string } = {},
  ): Promise<Schemas['ConversationView']> {
    const { data } = await this.raw.POST('/v1/conversations', {
      body: { type: 'GROUP', memberIds, title: options.title },
      headers: options.idempotencyKey ? { 'idempotency-key': options.idempotencyKey } : {},
    });
    return data!;
  }

  /**
   * Marks the conversation read up to `seq`: 200 with the outcome when applied at once,
   * 202 with the accepted seq when the stream path applies it within a moment.
   */
  async markRead(
    conversationId: number,
    seq: number,
  ): Promise<Schemas['ReadOutcome'] | Schemas['Accepted']> {
    const { data } = await this.raw.POST('/v1/conversations/{id}/read', {
      params: { path: { id: conversationId } },
      body: { seq },
    });
    return data!;
  }
}
