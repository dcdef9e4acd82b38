/**
 * What tests/push/sdk.rs passes the package's tests: where the stack answers and two
 * users' tokens.
 *   CHATPIPE_API_URL, CHATPIPE_GATEWAY_URL,
 *   CHATPIPE_USERS = {"alice": {"id", "token"}, "bob": {"id", "token", "expiredToken"}}
 *   CHATPIPE_GATEWAY_PROCESS = {"bin", "env", "url"}: a gateway binary a test may kill
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';

import { Rest } from '../src/index.js';

export interface User {
  id: number;
  token: string;
  expiredToken?: string;
}

function env(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run the package's tests through tests/push/sdk.rs`);
  return value;
}

export const apiUrl = env('CHATPIPE_API_URL');
export const gatewayUrl = env('CHATPIPE_GATEWAY_URL');
export const users = JSON.parse(env('CHATPIPE_USERS')) as { alice: User; bob: User };

/** A gateway of its own, as a process: started, and killed with SIGKILL. */
export interface GatewayProcess {
  url: string;
  start(): void;
  kill(): Promise<void>;
}

export function gatewayProcess(): GatewayProcess {
  const spec = JSON.parse(env('CHATPIPE_GATEWAY_PROCESS')) as { bin: string; env: Record<string, string>; url: string };
  let child: ChildProcess | undefined;
  return {
    url: spec.url,
    start() {
      assert.equal(child, undefined, 'the gateway process is running already');
      child = spawn(spec.bin, [], { env: { ...process.env, ...spec.env }, stdio: ['ignore', 'ignore', 'inherit'] });
    },
    async kill() {
      const running = child;
      child = undefined;
      if (!running || running.exitCode !== null) return;
      const exited = once(running, 'exit');
      running.kill('SIGKILL');
      await exited;
    },
  };
}

export function rest(user: User, fetch?: typeof globalThis.fetch): Rest {
  return new Rest({ baseUrl: apiUrl, token: () => user.token, fetch });
}

/** Polls `check` until it returns true; fails with `what()` after `ms`. */
export async function eventually(check: () => boolean | Promise<boolean>, what: () => string, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `not within ${ms} ms: ${what()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
