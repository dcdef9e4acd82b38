CREATE OR REPLACE FUNCTION public.chat_reply_deleted(p_conversation bigint, p_root bigint, p_seq bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    b_conv BIGINT[];
    b_user BIGINT[];
    b_n INT[];
BEGIN
    SELECT array_agg(u.conversation_id), array_agg(u.user_id), array_agg(u.unread)
      INTO b_conv, b_user, b_n
      FROM chat_thread_unread(ARRAY[p_conversation], ARRAY[p_root]) u;
    UPDATE message_thread t
       SET reply_count = t.reply_count - 1,
           last_live_seq = coalesce(l.seq, 0),
           last_reply_at = l.created_at,
           repliers = (SELECT coalesce(array_agg(x.sender_id ORDER BY x.first), '{}')
                         FROM (SELECT g.sender_id, min(g.seq) AS first FROM message g
                                WHERE g.conversation_id = p_conversation
                                  AND g.thread_root_seq = p_root AND g.deleted_at IS NULL
                                GROUP BY g.sender_id ORDER BY min(g.seq) LIMIT 3) x),
           changed_xid = pg_current_xact_id()
      FROM (SELECT NULL) AS one
      LEFT JOIN LATERAL (
            SELECT g.seq, g.created_at FROM message g
             WHERE g.conversation_id = p_conversation AND g.thread_root_seq = p_root
               AND g.deleted_at IS NULL
             ORDER BY g.seq DESC LIMIT 1) l ON true
     WHERE t.conversation_id = p_conversation AND t.root_seq = p_root;
    PERFORM chat_thread_unread_apply(b_conv, b_user, b_n, ARRAY[p_conversation], ARRAY[p_root]);
END
$function$;
