// The package as one ES module for the demo browser client (ingest-api/app/
// chatpipe-client.js, served at /app/ and compiled into ingest-api). `node bundle.mjs`
// writes it; `node bundle.mjs --check` fails if the committed one differs from a fresh
// bundle (test/bundle.test.ts runs that).
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import * as esbuild from 'esbuild';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const target = here('../../ingest-api/app/chatpipe-client.js');

const result = await esbuild.build({
  entryPoints: [here('src/index.ts')],
  bundle: true,
  format: 'esm',
  target: 'es2022',
  legalComments: 'inline',
  banner: {
    js: '// @chatpipe/client (clients/typescript), bundled by its `npm run bundle`: do not edit here.',
  },
  write: false,
});
const fresh = result.outputFiles[0].text;
if (process.argv.includes('--check')) {
  if (readFileSync(target, 'utf8') !== fresh) {
    console.error(`${target} is stale: run npm run bundle in clients/typescript and commit it`);
    process.exit(1);
  }
} else {
  writeFileSync(target, fresh);
}
