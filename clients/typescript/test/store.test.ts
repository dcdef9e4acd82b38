/**
 * The conversation store against the real stack (tests/push/sdk.rs starts it): each
 * test ends with the stores equal to what history says, read over REST on its own.
 */
import assert from 'node:assert/strict';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import { ConversationStore, Gateway, type Message, type Rest } from '../src/index.js';
import { FileStorage } from '../src/node.js';
import { eventually, gatewayProcess, gatewayUrl, rest, users, type User } from './env.js';

/** What history holds now, in the store's shape: (seq, body or null, deleted). */
async function history(api: Rest, conversationId: number): Promise<string> {
  const all: Array<[number, string | null, boolean]> = [];
  let after = 0;
  for (;;) {
    const page = await api.history(conversationId, { afterSeq: after, limit: 100 });
    for (const m of page.messages) all.push([m.seq, m.deleted ? null : (m.body ?? null), Boolean(m.deleted)]);
    if (!page.hasMore || page.messages.length === 0) return JSON.stringify(all);
    after = page.messages.at(-1)!.seq;
  }
}

function held(messages: Message[]): string {
  return JSON.stringify(messages.map((m) => [m.seq, m.body, Boolean(m.deleted)]));
}

/** A client as an app runs one: a store fed by a gateway connection. */
async function client(user: User, url = gatewayUrl) {
  const api = rest(user);
  const store = new ConversationStore({ rest: api, userId: user.id });
  await store.open();
  /** Every frame the connections received. */
  const frames: Array<Record<string, unknown>> = [];
  /** What the connections went through (for the failure messages). */
  const states: string[] = [];
  const start = () => {
    const gateway = new Gateway({
      url,
      token: () => user.token,
      firstBackoffMs: 100,
      onFrame: (f) => {
        frames.push(f as Record<string, unknown>);
        void store.apply(f);
      },
      onCatchUp: () => void store.catchUp(),
      onState: (s, detail) => states.push(detail ? `${s}: ${detail}` : s),
    });
    gateway.start();
    return gateway;
  };
  return { api, store, start, frames, states };
}

test('two clients end with stores equal to history after sends, an edit, a delete and a reconnect', async () => {
  const alice = await client(users.alice);
  const bob = await client(users.bob);
  const group = await alice.api.createGroup([users.bob.id], { title: 'store' });
  const id = group.conversationId;
  const aliceGateway = alice.start();
  let bobGateway = bob.start();
  try {
    for (let i = 0; i < 3; i++) await alice.store.send(id, `before ${i}`);
    await eventually(
      () => bob.store.messages(id).length === 3,
      () => `bob holds ${held(bob.store.messages(id))}`,
    );
    // Bob's connection goes away; what happens meanwhile comes with his catch-up.
    bobGateway.stop();
    for (let i = 0; i < 3; i++) await alice.store.send(id, `while away ${i}`);
    await eventually(() => alice.store.pendingSends().length === 0, () => 'alice has sends pending');
    await alice.api.raw.PATCH('/v1/conversations/{id}/messages/{seq}', {
      params: { path: { id, seq: 2 } },
      body: { body: 'before 1, edited' },
    });
    await alice.api.raw.DELETE('/v1/conversations/{id}/messages/{seq}', {
      params: { path: { id, seq: 4 } },
    });
    bobGateway = bob.start();
    const truth = async () => history(alice.api, id);
    for (const [who, store] of [
      ['alice', alice.store],
      ['bob', bob.store],
    ] as const) {
      let want = '';
      await eventually(
        async () => {
          want = await truth();
          return held(store.messages(id)) === want;
        },
        () => `${who} holds ${held(store.messages(id))}, history ${want}`,
      );
    }
    const messages = bob.store.messages(id);
    assert.equal(messages.length, 6);
    assert.equal(messages[1]!.body, 'before 1, edited');
    assert.equal(messages[3]!.body, null, 'a deleted message has no body');
  } finally {
    aliceGateway.stop();
    bobGateway.stop();
    alice.store.close();
    bob.store.close();
  }
});

/** Waits until each store holds what history holds. */
async function converged(api: Rest, id: number, stores: Array<[string, ConversationStore]>): Promise<void> {
  for (const [who, store] of stores) {
    let want = '';
    await eventually(
      async () => {
        want = await history(api, id);
        return held(store.messages(id)) === want;
      },
      () => `${who} holds ${held(store.messages(id))}, history ${want}`,
    );
  }
}

test('a gateway killed mid-conversation: the clients reconnect, catch up, and end equal to history', async () => {
  const gateway = gatewayProcess();
  gateway.start();
  const alice = await client(users.alice, gateway.url);
  const bob = await client(users.bob, gateway.url);
  const group = await alice.api.createGroup([users.bob.id], { title: 'killed' });
  const id = group.conversationId;
  const connections = [alice.start(), bob.start()];
  try {
    for (let i = 0; i < 3; i++) await alice.store.send(id, `before ${i}`);
    await eventually(
      () => bob.store.messages(id).length === 3,
      () => `bob holds ${held(bob.store.messages(id))}; states ${bob.states}; frames ${JSON.stringify(bob.frames)}`,
    );

    // SIGKILL: no close frame, no presence tombstone. Sends, an edit and a delete go on
    // over REST while the clients' sockets are gone and they retry.
    const killedAt = bob.states.length;
    await gateway.kill();
    for (let i = 0; i < 3; i++) await alice.store.send(id, `while down ${i}`);
    await eventually(() => alice.store.pendingSends().length === 0, () => 'alice has sends pending');
    await alice.api.raw.PATCH('/v1/conversations/{id}/messages/{seq}', {
      params: { path: { id, seq: 1 } },
      body: { body: 'before 0, edited' },
    });
    await alice.api.raw.DELETE('/v1/conversations/{id}/messages/{seq}', { params: { path: { id, seq: 5 } } });
    assert.equal(bob.store.messages(id).length, 3, 'bob had no way to hear of them');
    // Bob's client tried the dead gateway, failed, and keeps trying.
    await eventually(
      () => bob.states.slice(killedAt).some((s) => s.includes('connection failed')),
      () => `bob's connection since the kill: ${bob.states.slice(killedAt)}`,
    );

    gateway.start();
    await converged(alice.api, id, [
      ['alice', alice.store],
      ['bob', bob.store],
    ]);
    // And the connections push again: a send after the restart is pushed to bob.
    await alice.store.send(id, 'after the restart');
    await eventually(
      () => bob.frames.some((f) => f.type === 'message.new' && f.conversationId === id && f.seq === 7),
      () => 'seq 7 was not pushed to bob',
    );
    await converged(alice.api, id, [['bob', bob.store]]);
    const messages = bob.store.messages(id);
    assert.equal(messages[0]!.body, 'before 0, edited');
    assert.equal(messages[4]!.body, null, 'the message deleted while the gateway was down has no body');
  } finally {
    for (const c of connections) c.stop();
    alice.store.close();
    bob.store.close();
    await gateway.kill();
  }
});

test('sends pending through a reload are sent once each, with the same clientMsgId', async () => {
  const api = rest(users.alice);
  const group = await api.createGroup([users.bob.id]);
  const id = group.conversationId;
  const storage = new FileStorage(await mkdtemp(join(tmpdir(), 'chatpipe-store-')));
  // The first page: the network is gone, except that one send reached the server and
  // only its answer was lost.
  let answered = 0;
  const offline: typeof fetch = async (input, init) => {
    const request = new Request(input, init);
    if (request.method === 'POST' && request.url.endsWith('/messages') && answered === 0) {
      answered++;
      await fetch(request);
      throw new TypeError('network error: the answer was lost');
    }
    throw new TypeError('network error: offline');
  };
  const before = new ConversationStore({
    rest: rest(users.alice, offline),
    userId: users.alice.id,
    storage,
    firstRetryMs: 60_000,
  });
  await before.open();
  const sent = [];
  for (const body of ['one', 'two', 'three']) sent.push(await before.send(id, body));
  await eventually(() => answered === 1, () => 'the first send never reached the server');
  before.close();
  assert.equal(before.pendingSends().length, 3, 'all three pending: no answer came');

  // The reload: a new store on the same storage, online.
  const after = new ConversationStore({ rest: api, userId: users.alice.id, storage });
  await after.open();
  await eventually(() => after.pendingSends().length === 0, () => JSON.stringify(after.pendingSends()));
  const page = await api.history(id, { afterSeq: 0 });
  assert.deepEqual(
    page.messages.map((m) => [m.body, m.clientMsgId]),
    sent.map((p) => [p.body, p.clientMsgId]),
    'each pending send committed once, under its clientMsgId, in order',
  );
  assert.equal(held(after.messages(id)), await history(api, id));
  after.close();
});

test('an edit before its message is applied when it comes, and a deleted message stays deleted', async () => {
  const api = rest(users.alice);
  const group = await api.createGroup([users.bob.id]);
  const id = group.conversationId;
  const store = new ConversationStore({ rest: api, userId: users.alice.id });
  await store.open();
  await store.catchUp();
  const at = new Date().toISOString();
  const push = (seq: number, body: string) =>
    store.apply({ type: 'message.new', conversationId: id, seq, senderId: users.bob.id, body, createdAt: at, clientMsgId: crypto.randomUUID() });
  await store.apply({ type: 'message.edited', conversationId: id, seq: 1, body: 'edited first', editedAt: at });
  await store.apply({ type: 'message.deleted', conversationId: id, seq: 2 });
  await push(1, 'original');
  await push(2, 'gone');
  await push(2, 'gone'); // a repeated push changes nothing
  await store.apply({ type: 'message.edited', conversationId: id, seq: 2, body: 'back?', editedAt: at });
  assert.equal(held(store.messages(id)), JSON.stringify([[1, 'edited first', false], [2, null, true]]));
  store.close();
});
