-- A watermark move counts the deleted seqs and replies it passes as the conversation's
-- counts less those past the new watermark, not as the rows between the old watermark and
-- the new one.
--
-- The range count missed rows that had moved to the cold tier: `message` no longer holds
-- them, so a member who read across them was not counted past them, and their unread
-- count went below zero. What lies past a watermark is newer than what lies below it,
-- and the cold tier takes the oldest: a watermark at or past the conversation's
-- cold_through (every read of what is recent, every read to the end) counts exactly
-- what it passed. One still short of cold_through misses the archived rows between the
-- two, and counts them as passed already; such a member reads history that is older
-- than the hot window.
--
-- The conversation's counts are read in the same statement as the rows past the
-- watermark, under the conversation's delete lock taken shared (deletes and sends with
-- replies, the only changes of either count, take it exclusive), so the two agree. The
-- counts no longer depend on the member's old values: a move repairs a count that was
-- wrong before it.
CREATE OR REPLACE FUNCTION chat_advance_reads(p_conversations bigint[], p_users bigint[], p_seqs bigint[])
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
