/**
 * The REST client and the gateway connection against the real stack: ingest-api, fanout
 * and a gateway started by tests/push/sdk.rs (./env.ts says what it passes).
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test } from 'node:test';

import { Gateway, ProblemError, Rest, type Frame, type MessageNew } from '../src/index.js';
import { apiUrl, gatewayUrl, rest, users, type User } from './env.js';

/** Resolves with the first frame `want` takes, or rejects after `ms`. */
function frameWhere(frames: Frame[], listeners: Array<(f: Frame) => void>, want: (f: Frame) => boolean, ms = 20_000): Promise<Frame> {
  const seen = frames.find(want);
  if (seen) return Promise.resolve(seen);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no matching frame in ${ms} ms; saw ${JSON.stringify(frames)}`)), ms);
    listeners.push((f) => {
      if (want(f)) {
        clearTimeout(timer);
        resolve(f);
      }
    });
  });
}

/** A started gateway connection that records its frames and catch-ups. */
function connect(user: User, token = (_: { refresh: boolean }) => user.token) {
  const frames: Frame[] = [];
  const listeners: Array<(f: Frame) => void> = [];
  const states: string[] = [];
  let catchUps = 0;
  const gateway = new Gateway({
    url: gatewayUrl,
    token,
    firstBackoffMs: 100,
    onFrame: (f) => {
      frames.push(f);
      for (const l of listeners) l(f);
    },
    onCatchUp: () => {
      catchUps++;
    },
    onState: (s, detail) => states.push(detail ? `${s}: ${detail}` : s),
  });
  gateway.start();
  return {
    gateway,
    states,
    catchUps: () => catchUps,
    until: (want: (f: Frame) => boolean) => frameWhere(frames, listeners, want),
  };
}

test('a message sent over REST reaches the other member once its socket is ready, as history has it', async () => {
  const alice = rest(users.alice);
  const bob = rest(users.bob);
  const group = await alice.createGroup([users.bob.id], { title: 'sdk' });
  const started = performance.now();
  const socket = connect(users.bob);
  try {
    await socket.until((f) => f.type === 'ready');
    const ready = performance.now() - started;
    assert.equal(socket.catchUps(), 1, 'one catch-up: on ready');
    const clientMsgId = randomUUID();
    const sent = await alice.send(group.conversationId, { clientMsgId, body: 'hello from the sdk' });
    assert.equal(sent.clientMsgId, clientMsgId);
    const pushed = (await socket.until(
      (f) => f.type === 'message.new' && (f as MessageNew).conversationId === group.conversationId && (f as MessageNew).seq === sent.seq,
    )) as MessageNew;
    assert.equal(pushed.body, 'hello from the sdk');
    const pushedAt = performance.now() - started;
    console.log(`from start: ready in ${ready.toFixed(0)} ms, the first push in ${pushedAt.toFixed(0)} ms`);
    assert.equal(pushed.clientMsgId, clientMsgId);
    const history = await bob.history(group.conversationId, { afterSeq: 0 });
    assert.deepEqual(
      history.messages.map((m) => [m.seq, m.body]),
      [[sent.seq, 'hello from the sdk']],
    );
    // A retry with the same clientMsgId is the same message.
    const again = await alice.send(group.conversationId, { clientMsgId, body: 'hello from the sdk' });
    assert.equal(again.seq, sent.seq);
  } finally {
    socket.gateway.stop();
  }
});

test('an error answer is a ProblemError naming its type, status, field and request id', async () => {
  const alice = rest(users.alice);
  const group = await alice.createGroup([users.bob.id]);
  await assert.rejects(
    alice.send(group.conversationId, { clientMsgId: 'not-a-uuid', body: 'x' }),
    (err: unknown) => {
      assert.ok(err instanceof ProblemError, String(err));
      assert.ok(err.status === 400 || err.status === 422, `status ${err.status}`);
      assert.match(err.type, /^\/problems\//);
      assert.equal(err.code, err.type.split('/').pop());
      assert.ok(err.field?.includes('clientMsgId'), `field ${err.field}`);
      assert.ok(err.requestId, 'a request id');
      return true;
    },
  );
  const stranger = new Rest({ baseUrl: apiUrl, token: () => users.bob.token });
  const own = await alice.createGroup([]);
  await assert.rejects(stranger.history(own.conversationId), (err: unknown) => {
    assert.ok(err instanceof ProblemError, String(err));
    assert.equal(err.status, 404, err.message);
    return true;
  });
});

test('a refused token is replaced by a fresh one from the provider, and the socket gets ready', async () => {
  const asked: boolean[] = [];
  const socket = connect(users.bob, ({ refresh }) => {
    asked.push(refresh);
    return refresh ? users.bob.token : users.bob.expiredToken!;
  });
  try {
    await socket.until((f) => f.type === 'ready');
    assert.deepEqual(asked, [false, true], 'the expired token, then a fresh one');
    assert.ok(
      socket.states.some((s) => s.startsWith('reconnecting: closed 4001')),
      JSON.stringify(socket.states),
    );
  } finally {
    socket.gateway.stop();
  }
});
