/**
 * Where a {@link ConversationStore} keeps what must outlive the page or the process: its
 * conversations, its sync cursor and the sends not yet committed. Strings under keys;
 * bring your own (IndexedDB, SQLite, a mobile key-value store) or use one of these.
 */
export interface Storage {
  get(key: string): Promise<string | null>;
  set(key: string, value: string): Promise<void>;
  delete(key: string): Promise<void>;
}

/** Kept in memory: gone with the process (tests, a tab that never reloads). */
export class MemoryStorage implements Storage {
  private readonly values = new Map<string, string>();

  async get(key: string): Promise<string | null> {
    return this.values.get(key) ?? null;
  }

  async set(key: string, value: string): Promise<void> {
    this.values.set(key, value);
  }

  async delete(key: string): Promise<void> {
    this.values.delete(key);
  }
}

/**
 * The browser's IndexedDB: one object store of strings in database `name`. Survives
 * reloads, so a message typed before a reload is still sent after it.
 */
export class IndexedDbStorage implements Storage {
  private readonly db: Promise<IDBDatabase>;

  constructor(name = 'chatpipe') {
    this.db = new Promise((resolve, reject) => {
      const open = indexedDB.open(name, 1);
      open.onupgradeneeded = () => open.result.createObjectStore('kv');
      open.onsuccess = () => resolve(open.result);
      open.onerror = () => reject(open.error);
    });
  }

  private async run<T>(mode: IDBTransactionMode, op: (kv: IDBObjectStore) => IDBRequest<T>): Promise<T> {
    const db = await this.db;
    return new Promise((resolve, reject) => {
      const request = op(db.transaction('kv', mode).objectStore('kv'));
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  }

  async get(key: string): Promise<string | null> {
    const value = await this.run('readonly', (kv) => kv.get(key));
    return typeof value === 'string' ? value : null;
  }

  async set(key: string, value: string): Promise<void> {
    await this.run('readwrite', (kv) => kv.put(value, key));
  }

  async delete(key: string): Promise<void> {
    await this.run('readwrite', (kv) => kv.delete(key));
  }
}
