CREATE OR REPLACE FUNCTION public.chat_advance_reads(p_conversations bigint[], p_users bigint[], p_seqs bigint[])
 RETURNS TABLE(conversation_id bigint, user_id bigint, last_read_seq bigint)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock_shared(c) FROM unnest(p_conversations) AS c;
    RETURN QUERY
    UPDATE conversation_member m
       SET last_read_seq = LEAST(b.seq, c.last_seq),
           -- What the conversation counts, less what lies past the new watermark
           -- (migration 20261207000004).
           deleted_read = c.deleted_count - (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = m.conversation_id AND d.deleted_at IS NOT NULL
                  AND d.thread_root_seq IS NULL AND d.seq > LEAST(b.seq, c.last_seq)),
           reply_read = c.reply_count - (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = m.conversation_id AND d.thread_root_seq IS NOT NULL
                  AND d.seq > LEAST(b.seq, c.last_seq)),
           mention_read = m.mention_read + (
               SELECT count(*) FROM message_mention n
                WHERE n.conversation_id = m.conversation_id AND n.user_id = m.user_id
                  AND n.seq > m.last_read_seq AND n.seq <= LEAST(b.seq, c.last_seq)),
           changed_xid = pg_current_xact_id()
      FROM unnest(p_conversations, p_users, p_seqs) AS b(conversation_id, user_id, seq)
      JOIN conversation c ON c.id = b.conversation_id
     WHERE m.conversation_id = b.conversation_id
       AND m.user_id = b.user_id
       AND m.last_read_seq < LEAST(b.seq, c.last_seq)
    RETURNING m.conversation_id, m.user_id, m.last_read_seq;
END
$function$;
