CREATE OR REPLACE FUNCTION public.chat_set_mentions(p_conversation bigint, p_seq bigint, p_users bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_sender BIGINT;
    v_at TIMESTAMPTZ;
    v_named BIGINT[];
BEGIN
    SELECT sender_id, created_at INTO v_sender, v_at FROM message
     WHERE conversation_id = p_conversation AND seq = p_seq;
    WITH gone AS (
        DELETE FROM message_mention n
         WHERE n.conversation_id = p_conversation AND n.seq = p_seq
           AND n.user_id <> ALL (p_users)
        RETURNING n.user_id
    )
    UPDATE conversation_member m
       SET mention_count = m.mention_count - 1,
           mention_read = m.mention_read - (p_seq <= m.last_read_seq)::int,
           changed_xid = pg_current_xact_id()
      FROM gone g
     WHERE m.conversation_id = p_conversation AND m.user_id = g.user_id;
    WITH came AS (
        INSERT INTO message_mention (conversation_id, user_id, seq, sender_id, created_at)
        SELECT p_conversation, m.user_id, p_seq, v_sender, v_at
          FROM conversation_member m
         WHERE m.conversation_id = p_conversation AND m.user_id = ANY (p_users)
           AND m.user_id <> v_sender
        ON CONFLICT DO NOTHING
        RETURNING user_id
    )
    UPDATE conversation_member m
       SET mention_count = m.mention_count + 1,
           mention_read = m.mention_read + (p_seq <= m.last_read_seq)::int,
           changed_xid = pg_current_xact_id()
      FROM came c
     WHERE m.conversation_id = p_conversation AND m.user_id = c.user_id;
    SELECT coalesce(array_agg(n.user_id ORDER BY n.user_id), '{}') INTO v_named
      FROM message_mention n WHERE n.conversation_id = p_conversation AND n.seq = p_seq;
    RETURN v_named;
END
$function$;
