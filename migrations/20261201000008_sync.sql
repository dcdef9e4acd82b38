-- One-call sync (GET /sync). The columns it reads came with 20261201000007; here are the
-- key that signs its cursors and the statement that finds one conversation's changed
-- messages.

-- The key every ingest-api process signs sync cursors with (HMAC-SHA256), so a cursor
-- this API did not hand out is refused. Made here from PostgreSQL's strong random source
-- (gen_random_uuid), once per database; every process of a deployment reads the same.
CREATE TABLE sync_cursor_key (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    key BYTEA   NOT NULL CHECK (length(key) = 32)
);
INSERT INTO sync_cursor_key (id, key)
VALUES (1, decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));

-- The messages of one conversation that changed since `p_cursor`, newest first, at most
-- p_limit + 1 (one more tells the caller there are more). Two parts, neither reading
-- history:
--   * the new ones: seqs commit in order within a conversation (the row lock), so the
--     messages a snapshot saw are a prefix 1..k. Walking down from the top one seq at a
--     time (seqs are gapless) finds the suffix of messages that changed since, and stops
--     at the first one that did not;
--   * edits and deletes below that suffix, from message_changed_idx by transaction id.
CREATE FUNCTION chat_sync_messages(p_conversation BIGINT, p_top BIGINT, p_cursor pg_snapshot,
                                   p_limit INTEGER)
RETURNS SETOF message
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE fresh AS (
        SELECT g.* FROM message g
         WHERE g.conversation_id = p_conversation AND g.seq = p_top
           AND chat_changed_since(g.changed_xid, p_cursor)
        UNION ALL
        SELECT g.* FROM fresh f
          JOIN message g ON g.conversation_id = p_conversation AND g.seq = f.seq - 1
         WHERE chat_changed_since(g.changed_xid, p_cursor)
    ),
    newest AS (SELECT * FROM fresh LIMIT p_limit + 1)
    SELECT * FROM (
        SELECT * FROM newest
        UNION ALL
        SELECT g.* FROM message g
         WHERE g.conversation_id = p_conversation
           AND (g.edited_at IS NOT NULL OR g.deleted_at IS NOT NULL)
           AND g.changed_xid >= pg_snapshot_xmin(p_cursor)
           AND chat_changed_since(g.changed_xid, p_cursor)
           AND g.seq < coalesce((SELECT min(n.seq) FROM newest n), p_top + 1)
    ) AS changed
    ORDER BY seq DESC
    LIMIT p_limit + 1
$$;
