CREATE OR REPLACE FUNCTION public.chat_mark_read(p_conversation bigint, p_user bigint, p_seq bigint, p_event_id uuid, p_head bytea, p_tail bytea, p_aggregatetype text, p_clear_outbox boolean)
 RETURNS TABLE(last_read_seq bigint, advanced boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    moved_to BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_conversation);
    UPDATE conversation_member m
       SET last_read_seq = LEAST(p_seq, c.last_seq),
           deleted_read = m.deleted_read + (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = p_conversation AND d.deleted_at IS NOT NULL
                  AND d.seq > m.last_read_seq AND d.seq <= LEAST(p_seq, c.last_seq)),
           changed_xid = pg_current_xact_id()
      FROM conversation c
     WHERE c.id = p_conversation
       AND m.conversation_id = p_conversation AND m.user_id = p_user
       AND m.last_read_seq < LEAST(p_seq, c.last_seq)
    RETURNING m.last_read_seq INTO moved_to;
    IF NOT FOUND THEN
        RETURN QUERY SELECT m.last_read_seq, FALSE FROM conversation_member m
                      WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
        RETURN;
    END IF;
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    VALUES (p_event_id, p_aggregatetype, p_conversation::TEXT, 'read.updated',
            p_head || chat_avro_long(moved_to) || p_tail);
    IF p_clear_outbox THEN
        DELETE FROM outbox o WHERE o.id = p_event_id;
    END IF;
    RETURN QUERY SELECT moved_to, TRUE;
END
$function$;
