export { Rest, type RestOptions, type Schemas, type TokenProvider } from './rest.js';
export { ProblemError, type Problem } from './problem.js';
export { Gateway, CloseCode, SUBPROTOCOL, type ConnectionState, type GatewayOptions } from './gateway.js';
export type * from './frames.js';
export type { paths, components } from './openapi.js';
export { ConversationStore, type Conversation, type Message, type StoreOptions } from './store.js';
export { Outbox, type PendingSend } from './outbox.js';
export { MemoryStorage, IndexedDbStorage, type Storage } from './storage.js';
