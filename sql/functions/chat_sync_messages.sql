CREATE OR REPLACE FUNCTION public.chat_sync_messages(p_conversation bigint, p_top bigint, p_cursor pg_snapshot, p_limit integer)
 RETURNS SETOF message
 LANGUAGE sql
 STABLE
AS $function$ SELECT * FROM chat_sync_messages(p_conversation, p_top, p_cursor, NULL, p_limit) $function$;

CREATE OR REPLACE FUNCTION public.chat_sync_messages(p_conversation bigint, p_top bigint, p_cursor pg_snapshot, p_upto pg_snapshot, p_limit integer)
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
