-- The message table, partitioned by hash of conversation_id (the design: "partition the
-- message table by conversation_id"). Every query of ours names one conversation, so
-- each touches one partition; each partition has its own indexes, vacuum and
-- statistics, at a sixteenth of the table's size.
--
-- MESSAGE_PARTITIONS = 16. A power of two, so that a partition can later be split in
-- two (detach it, attach two with the doubled modulus, copy its rows back) without
-- touching the others. 16 keeps each partition under ~200 GB up to ~3 TB of hot
-- messages (docs/operations.md, "Storage").
--
-- The conversion copies the rows into the new table inside this migration's
-- transaction, which holds the old table locked: writes wait until it commits (about
-- 1 GB of messages a minute on this stack's machine). Column order, defaults,
-- constraints and index names stay as they were; the two sync functions, whose rows are
-- the table's type, are made again as they were.

CREATE TABLE message_partitioned (
    conversation_id BIGINT      NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    seq             BIGINT      NOT NULL CHECK (seq > 0),
    sender_id       BIGINT      NOT NULL,
    client_msg_id   UUID        NOT NULL,
    body            TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    edited_at       TIMESTAMPTZ,
    deleted_at      TIMESTAMPTZ,
    deleted_by      BIGINT,
    changed_xid     xid8        DEFAULT pg_current_xact_id(),
    CHECK ((deleted_at IS NULL) = (body IS NOT NULL) AND (deleted_at IS NULL) = (deleted_by IS NULL))
) PARTITION BY HASH (conversation_id);

DO $$
DECLARE
    partitions CONSTANT INT := 16;  -- MESSAGE_PARTITIONS
BEGIN
    FOR r IN 0 .. partitions - 1 LOOP
        EXECUTE format(
            'CREATE TABLE message_p%s PARTITION OF message_partitioned
                 FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
            lpad(r::TEXT, 2, '0'), partitions, r);
    END LOOP;
END
$$;

INSERT INTO message_partitioned (conversation_id, seq, sender_id, client_msg_id, body,
                                 created_at, edited_at, deleted_at, deleted_by, changed_xid)
SELECT conversation_id, seq, sender_id, client_msg_id, body,
       created_at, edited_at, deleted_at, deleted_by, changed_xid
  FROM message;

-- The sync functions return rows of the table's type: they go with the old table and
-- come back, unchanged, on the new one.
DROP FUNCTION chat_sync_messages(BIGINT, BIGINT, pg_snapshot, INTEGER);
DROP FUNCTION chat_sync_messages(BIGINT, BIGINT, pg_snapshot, pg_snapshot, INTEGER);
DROP TABLE message;
ALTER TABLE message_partitioned RENAME TO message;

-- The names the unpartitioned table's constraints and indexes had.
ALTER TABLE message RENAME CONSTRAINT message_partitioned_conversation_id_fkey TO message_conversation_id_fkey;
ALTER TABLE message RENAME CONSTRAINT message_partitioned_seq_check TO message_seq_check;
ALTER TABLE message RENAME CONSTRAINT message_partitioned_check TO message_body_erased_when_deleted;
ALTER TABLE message ADD CONSTRAINT message_pkey PRIMARY KEY (conversation_id, seq);
ALTER TABLE message ADD CONSTRAINT message_conversation_id_client_msg_id_key
    UNIQUE (conversation_id, client_msg_id);
-- The deleted seqs of a conversation, for counting those a watermark passes over.
CREATE INDEX message_deleted_idx ON message (conversation_id, seq) WHERE deleted_at IS NOT NULL;
-- Edited and deleted messages by when they changed (sync).
CREATE INDEX message_changed_idx ON message (conversation_id, changed_xid)
    WHERE edited_at IS NOT NULL OR deleted_at IS NOT NULL;


CREATE FUNCTION chat_sync_messages(p_conversation bigint, p_top bigint, p_cursor pg_snapshot, p_upto pg_snapshot, p_limit integer)
 RETURNS SETOF message
 LANGUAGE sql
 STABLE
AS $function$
    WITH RECURSIVE fresh AS (
        SELECT g.* FROM message g
         WHERE g.conversation_id = p_conversation AND g.seq = p_top
           AND chat_changed_since(g.changed_xid, p_cursor)
        UNION ALL
        SELECT g.* FROM fresh f
          JOIN message g ON g.conversation_id = p_conversation AND g.seq = f.seq - 1
         WHERE chat_changed_since(g.changed_xid, p_cursor)
    ),
    newest AS (
        SELECT * FROM fresh
         WHERE p_upto IS NULL OR NOT chat_changed_since(changed_xid, p_upto)
         LIMIT p_limit + 1
    )
    SELECT * FROM (
        SELECT * FROM newest
        UNION ALL
        SELECT g.* FROM message g
         WHERE g.conversation_id = p_conversation
           AND (g.edited_at IS NOT NULL OR g.deleted_at IS NOT NULL)
           AND g.changed_xid >= pg_snapshot_xmin(p_cursor)
           AND chat_changed_since(g.changed_xid, p_cursor)
           AND (p_upto IS NULL OR NOT chat_changed_since(g.changed_xid, p_upto))
           AND g.seq < coalesce((SELECT min(n.seq) FROM newest n), p_top + 1)
    ) AS changed
    ORDER BY seq DESC
    LIMIT p_limit + 1
$function$;

CREATE FUNCTION chat_sync_messages(p_conversation bigint, p_top bigint, p_cursor pg_snapshot, p_limit integer)
 RETURNS SETOF message
 LANGUAGE sql
 STABLE
AS $function$ SELECT * FROM chat_sync_messages(p_conversation, p_top, p_cursor, NULL, p_limit) $function$;

ANALYZE message;
