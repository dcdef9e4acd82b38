-- Sync in bounded pages (GET /sync). A sync that does not fit one answer goes on in the
-- next call, which reads with a snapshot of its own but reports only the changes the
-- sync's first answer could see: those visible in `p_upto`, its snapshot. What committed
-- after it goes to the next sync, whose cursor is that snapshot, so each change is still
-- reported exactly once.

-- chat_sync_messages as 20261201000008 made it, bounded above by `p_upto` (NULL: no
-- bound). The walk down from the top still steps over the messages written after
-- p_upto (they are changed since p_cursor too), and reports none of them.
CREATE FUNCTION chat_sync_messages(p_conversation BIGINT, p_top BIGINT, p_cursor pg_snapshot,
                                   p_upto pg_snapshot, p_limit INTEGER)
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
$$;

-- The four-argument form stays for a process of the previous release during a rolling
-- upgrade; it is the bounded one without a bound.
CREATE OR REPLACE FUNCTION chat_sync_messages(p_conversation BIGINT, p_top BIGINT,
                                              p_cursor pg_snapshot, p_limit INTEGER)
RETURNS SETOF message
LANGUAGE sql STABLE
AS $$ SELECT * FROM chat_sync_messages(p_conversation, p_top, p_cursor, NULL, p_limit) $$;
