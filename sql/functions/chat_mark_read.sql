CREATE OR REPLACE FUNCTION public.chat_mark_read(p_conversation bigint, p_user bigint, p_seq bigint, p_event_id uuid, p_head bytea, p_tail bytea, p_aggregatetype text, p_clear_outbox boolean)
 RETURNS TABLE(last_read_seq bigint, advanced boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    moved_to BIGINT;
BEGIN
    SELECT a.last_read_seq INTO moved_to
      FROM chat_advance_reads(ARRAY[p_conversation], ARRAY[p_user], ARRAY[p_seq]) AS a;
    IF NOT FOUND THEN
        RETURN QUERY SELECT m.last_read_seq, FALSE FROM conversation_member m
                      WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
        RETURN;
    END IF;
    PERFORM chat_outbox_write(
        ARRAY[p_event_id], p_aggregatetype, ARRAY[p_conversation::TEXT],
        ARRAY['read.updated'], ARRAY[p_head || chat_avro_long(moved_to) || p_tail],
        p_clear_outbox);
    RETURN QUERY SELECT moved_to, TRUE;
END
$function$;
