-- The cold tier (issue 28): `pipeline archive` copies every message change from
-- chat.events into Cassandra and records here, per conversation, how far it has archived.
--
-- archived_seq: every message.new of the conversation up to this seq is written to
-- Cassandra (seqs are gapless and arrive in seq order within a conversation, and the
-- archiver commits its offsets only after its writes). Moving rows out of PostgreSQL
-- looks here first and then compares each row with Cassandra's copy: a row is removed
-- only where Cassandra holds its current version.
--
-- No foreign key: the archiver may record a conversation's progress in any order with
-- the conversation's own writes, and a record of a conversation that is gone is harmless.
CREATE TABLE message_archive (
    conversation_id BIGINT      PRIMARY KEY,
    archived_seq    BIGINT      NOT NULL CHECK (archived_seq >= 0),
    archived_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
