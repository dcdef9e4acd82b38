/**
 * The demo browser client (ingest-api/app) and the package: its copy of the package
 * (chatpipe-client.js) is this package now, and the paths it calls are the API's.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

test("the browser client's bundle of the package is fresh", () => {
  const root = fileURLToPath(new URL('../..', import.meta.url));
  execFileSync(process.execPath, ['bundle.mjs', '--check'], { cwd: root, stdio: 'inherit' });
});

test('every path the browser client calls is in the OpenAPI document', () => {
  const root = fileURLToPath(new URL('../../../..', import.meta.url));
  const api = readFileSync(`${root}/ingest-api/app/api.js`, 'utf8');
  const document = JSON.parse(readFileSync(`${root}/docs/openapi.json`, 'utf8')) as { paths: Record<string, unknown> };
  const called = [...api.matchAll(/'(\/v1\/[^']*)'/g)].map((m) => m[1]!);
  assert.ok(called.length >= 15, `the client calls ${called.length} paths`);
  const unknown = called.filter((path) => !(path in document.paths));
  assert.deepEqual(unknown, [], 'paths the document does not have');
});
