/**
 * Node-only parts (`@chatpipe/client/node`): a {@link Storage} in files.
 */
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import type { Storage } from './storage.js';

/** One file per key in `dir`, each replaced whole (written aside, then renamed). */
export class FileStorage implements Storage {
  constructor(private readonly dir: string) {}

  private path(key: string): string {
    return join(this.dir, `${encodeURIComponent(key)}.json`);
  }

  async get(key: string): Promise<string | null> {
    try {
      return await readFile(this.path(key), 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async set(key: string, value: string): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    const aside = `${this.path(key)}.${process.pid}.tmp`;
    await writeFile(aside, value, 'utf8');
    await rename(aside, this.path(key));
  }

  async delete(key: string): Promise<void> {
    await rm(this.path(key), { force: true });
  }
}
