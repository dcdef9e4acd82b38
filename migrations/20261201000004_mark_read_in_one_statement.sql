-- chat_mark_read: the direct-mode read (reads.mode = "direct") in one round trip instead
-- of five (BEGIN, the guarded UPDATE, the outbox insert, its delete, COMMIT). The same
-- guarded UPDATE as the receipts processor's flush: the watermark moves only forwards
-- and never past last_seq. When it moved, read.updated goes to the outbox in the same
-- transaction, its Avro bytes encoded by ingest-api around the watermark and the
-- watermark spliced in here. One row (where the watermark stands, whether this call
-- moved it), or none when the caller is no member.
CREATE FUNCTION chat_mark_read(
    p_conversation  BIGINT,
    p_user          BIGINT,
    p_seq           BIGINT,
    p_event_id      UUID,
    p_head          BYTEA,
    p_tail          BYTEA,
    p_aggregatetype TEXT,
    p_clear_outbox  BOOLEAN
) RETURNS TABLE (last_read_seq BIGINT, advanced BOOLEAN)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    moved_to BIGINT;
BEGIN
    UPDATE conversation_member m
       SET last_read_seq = LEAST(p_seq, c.last_seq)
      FROM conversation c
     WHERE c.id = p_conversation
       AND m.conversation_id = p_conversation AND m.user_id = p_user
       AND m.last_read_seq < LEAST(p_seq, c.last_seq)
    RETURNING m.last_read_seq INTO moved_to;
    IF NOT FOUND THEN
        -- A statement of its own, so it sees a concurrent read that moved the watermark
        -- further and committed while the UPDATE waited for its row.
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
$$;
