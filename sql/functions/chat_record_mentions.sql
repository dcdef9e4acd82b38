CREATE OR REPLACE FUNCTION public.chat_record_mentions(p_conversations bigint[], p_seqs bigint[], p_users bigint[], p_senders bigint[], p_created_at timestamp with time zone[])
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    written BIGINT;
BEGIN
    WITH wanted AS (
        SELECT DISTINCT w.conv, w.usr, w.seq, w.sender, w.at
          FROM unnest(p_conversations, p_seqs, p_users, p_senders, p_created_at)
               AS w(conv, seq, usr, sender, at)
         WHERE w.usr <> w.sender
    ),
    ins AS (
        INSERT INTO message_mention (conversation_id, user_id, seq, sender_id, created_at)
        SELECT w.conv, w.usr, w.seq, w.sender, w.at
          FROM wanted w
          JOIN conversation_member m ON m.conversation_id = w.conv AND m.user_id = w.usr
        ON CONFLICT DO NOTHING
        RETURNING conversation_id, user_id, seq
    ),
    counted AS (
        UPDATE conversation_member m
           SET mention_count = m.mention_count + cardinality(i.seqs),
               mention_read = m.mention_read
                   + (SELECT count(*) FROM unnest(i.seqs) AS s WHERE s <= m.last_read_seq),
               changed_xid = pg_current_xact_id()
          FROM (SELECT i.conversation_id, i.user_id, array_agg(i.seq) AS seqs
                  FROM ins i GROUP BY i.conversation_id, i.user_id) i
         WHERE m.conversation_id = i.conversation_id AND m.user_id = i.user_id
        RETURNING 1
    )
    SELECT count(*) INTO written FROM ins;
    RETURN written;
END
$function$;
