-- The message store and read state. Every invariant in DESIGN.md that the database
-- can hold, it holds here; the application only has to take the locks in order.

CREATE TABLE conversation (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type             TEXT        NOT NULL CHECK (type IN ('DIRECT', 'GROUP')),
    title            TEXT,
    created_by       BIGINT      NOT NULL CHECK (created_by > 0),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- seq of the newest message; the next message takes last_seq + 1 under FOR UPDATE.
    last_seq         BIGINT      NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    last_message_at  TIMESTAMPTZ,
    -- Inbox order: the newest message, or creation for an empty conversation.
    last_activity_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Kept in the same transaction as every membership change, under the row lock,
    -- so the 1,000-member cap holds under concurrency and the inbox needs no COUNT.
    member_count     INTEGER     NOT NULL DEFAULT 0 CHECK (member_count BETWEEN 0 AND 1000)
);

CREATE TABLE conversation_member (
    conversation_id BIGINT      NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    user_id         BIGINT      NOT NULL CHECK (user_id > 0),
    -- The read watermark: everything up to and including this seq has been read.
    last_read_seq   BIGINT      NOT NULL DEFAULT 0 CHECK (last_read_seq >= 0),
    joined_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, user_id)
);
-- The inbox: every conversation of one user.
CREATE INDEX conversation_member_user_idx ON conversation_member (user_id);
-- "Read by N" = count of members with last_read_seq >= seq: a range scan on this index.
CREATE INDEX conversation_member_watermark_idx ON conversation_member (conversation_id, last_read_seq);

CREATE TABLE message (
    conversation_id BIGINT      NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    seq             BIGINT      NOT NULL CHECK (seq > 0),
    sender_id       BIGINT      NOT NULL,
    client_msg_id   UUID        NOT NULL,
    body            TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (conversation_id, seq),
    UNIQUE (conversation_id, client_msg_id)
);

-- One DIRECT conversation per pair of users, whoever opens it first.
CREATE TABLE direct_pair (
    user_low        BIGINT NOT NULL,
    user_high       BIGINT NOT NULL,
    conversation_id BIGINT NOT NULL UNIQUE REFERENCES conversation (id) ON DELETE CASCADE,
    PRIMARY KEY (user_low, user_high),
    CHECK (0 < user_low AND user_low < user_high)
);

-- The transactional outbox, in the column names Debezium's outbox EventRouter reads
-- by default: the router sends `payload` to the topic chosen by `aggregatetype`, keyed
-- by `aggregateid` (the conversation id), with `type` as a header.
CREATE TABLE outbox (
    id            UUID        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype TEXT        NOT NULL,
    aggregateid   TEXT        NOT NULL,
    type          TEXT        NOT NULL,
    payload       BYTEA       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
