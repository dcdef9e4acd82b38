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
--
-- cold_through: every message of the conversation with seq <= cold_through has left
-- PostgreSQL and is read from Cassandra (history merges the two). The retention step
-- moves it, in the transaction that deletes those rows, only over a contiguous run of
-- rows it found equal in Cassandra; so PostgreSQL holds exactly the messages after it,
-- plus any older message an edit or a delete brought back (the row wins over
-- Cassandra's copy until the retention step finds the two equal again).
CREATE TABLE message_archive (
    conversation_id BIGINT      PRIMARY KEY,
    archived_seq    BIGINT      NOT NULL CHECK (archived_seq >= 0),
    archived_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    cold_through    BIGINT      NOT NULL DEFAULT 0 CHECK (cold_through >= 0),
    -- When the retention step should look at the conversation next: the first waiting
    -- message's createdAt plus storage.hot_retention (set by the archiver when something
    -- starts waiting, by the retention step after a sweep), now() for a message an edit
    -- or delete brought back; NULL: nothing to move.
    next_due_at     TIMESTAMPTZ,
    -- The newest changed_xid among the rows the retention step moved out: a /sync cursor
    -- that did not see it may lack a change PostgreSQL no longer holds, and is stale.
    moved_xid       xid8
);

-- The retention step's one question: which conversations are due.
CREATE INDEX message_archive_due ON message_archive (next_due_at) WHERE next_due_at IS NOT NULL;
