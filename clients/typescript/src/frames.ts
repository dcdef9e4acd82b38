/**
 * What the gateway pushes (docs/protocol.md; docs/asyncapi.yaml holds each frame's JSON
 * schema). A client ignores a `type` it does not know: newer gateways add types.
 */

/** A message, in full, or light (only where to look: fetch it over REST). */
export interface MessageNew {
  type: 'message.new';
  conversationId: number;
  seq: number;
  senderId?: number;
  body?: string;
  createdAt?: string;
  clientMsgId?: string;
  mentions?: number[];
  threadRootSeq?: number;
  light?: true;
}

export interface MessageEdited {
  type: 'message.edited';
  conversationId: number;
  seq: number;
  senderId?: number;
  body?: string;
  editedAt?: string;
  light?: true;
}

export interface MessageDeleted {
  type: 'message.deleted';
  conversationId: number;
  seq: number;
  light?: true;
}

export interface ReadUpdated {
  type: 'read.updated';
  conversationId: number;
  userId?: number;
  lastReadSeq: number;
  light?: true;
}

export interface Typing {
  type: 'typing';
  conversationId: number;
  userId: number;
}

/** Pushes may have been lost while the connection stayed open: catch up over REST. */
export interface Resync {
  type: 'resync';
  reason: string;
}

/** This connection's pushes are live: catch up over REST once, now. */
export interface Ready {
  type: 'ready';
  /** Everything committed from then on is pushed to this connection. */
  pushesFrom: string;
}

/** Any other frame (delivery.updated, reaction.*, mention, thread.read, newer ones). */
export interface OtherFrame {
  type: string;
  [field: string]: unknown;
}

export type Frame =
  | MessageNew
  | MessageEdited
  | MessageDeleted
  | ReadUpdated
  | Typing
  | Resync
  | Ready
  | OtherFrame;
