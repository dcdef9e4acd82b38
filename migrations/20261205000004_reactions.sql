-- Reactions (issue 29, point 4): who reacted with which key to which message, and each
-- key's count per message. The counts are kept by the statement that changes a
-- reaction (one more or one less, in the same transaction), never by counting rows, so
-- history reads at most the page's keys. A count reaching 0 deletes its row.
--
-- No foreign key to message: the retention step moves old messages out of PostgreSQL
-- (migration 20261205000003) and their reactions stay here. A delete of the message
-- removes its reactions in the delete's transaction.
CREATE TABLE message_reaction (
    conversation_id bigint      NOT NULL,
    seq             bigint      NOT NULL,
    reaction        text        NOT NULL,
    user_id         bigint      NOT NULL,
    reacted_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, seq, reaction, user_id)
);

CREATE TABLE message_reaction_count (
    conversation_id bigint      NOT NULL,
    seq             bigint      NOT NULL,
    reaction        text        NOT NULL,
    count           bigint      NOT NULL CHECK (count > 0),
    -- Keys are listed in the order they first appeared on the message.
    first_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, seq, reaction)
);
