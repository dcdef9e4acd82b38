-- One home each for the read watermark's move and for the outbox write, which were
-- written twice (in Rust, core/src/watermark.rs and core/src/outbox.rs, and again in
-- chat_mark_read): both now live here, and both callers call them.
--
-- chat_advance_reads: moves each (conversation, user) read watermark to
-- LEAST(seq, last_seq) if that is further than it stands; adds the deleted seqs it
-- passes over to deleted_read (exact unread under deletes); returns the rows that
-- moved. The conversations' delete locks are taken shared first, in a statement of
-- their own, so that the UPDATE's snapshot sees a delete that was in flight
-- (migration 20261201000007). Callers pass batches sorted by key, so concurrent
-- flushes lock rows in one order. Used by the receipts processor's flush (a window at
-- once) and by chat_mark_read (ingest-api's direct mode, one receipt).
--
-- chat_outbox_write: the outbox rows of a transaction, in the given order (WITH
-- ORDINALITY keeps it in the WAL, and so on the topic), deleted again at once unless
-- rows are kept until the auditor confirms them (outbox.retain_until_confirmed).
--
-- chat_send_many keeps its own outbox INSERT and its sender's read move inside its one
-- statement: a send batch is one statement by design (docs/architecture.md, "The send
-- path"), and a function call per row there would cost the hot path.

CREATE OR REPLACE FUNCTION chat_advance_reads(
    p_conversations BIGINT[], p_users BIGINT[], p_seqs BIGINT[]
) RETURNS TABLE (conversation_id BIGINT, user_id BIGINT, last_read_seq BIGINT)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock_shared(c) FROM unnest(p_conversations) AS c;
    RETURN QUERY
    UPDATE conversation_member m
       SET last_read_seq = LEAST(b.seq, c.last_seq),
           deleted_read = m.deleted_read + (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = m.conversation_id AND d.deleted_at IS NOT NULL
                  AND d.seq > m.last_read_seq AND d.seq <= LEAST(b.seq, c.last_seq)),
           changed_xid = pg_current_xact_id()
      FROM unnest(p_conversations, p_users, p_seqs) AS b(conversation_id, user_id, seq)
      JOIN conversation c ON c.id = b.conversation_id
     WHERE m.conversation_id = b.conversation_id
       AND m.user_id = b.user_id
       AND m.last_read_seq < LEAST(b.seq, c.last_seq)
    RETURNING m.conversation_id, m.user_id, m.last_read_seq;
END
$$;

CREATE OR REPLACE FUNCTION chat_outbox_write(
    p_ids UUID[], p_aggregatetype TEXT, p_keys TEXT[], p_types TEXT[], p_payloads BYTEA[],
    p_clear BOOLEAN
) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    SELECT e.i, p_aggregatetype, e.k, e.t, e.p
      FROM unnest(p_ids, p_keys, p_types, p_payloads) WITH ORDINALITY AS e(i, k, t, p, n)
     ORDER BY e.n;
    IF p_clear THEN
        DELETE FROM outbox o WHERE o.id = ANY (p_ids);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION chat_mark_read(
    p_conversation BIGINT, p_user BIGINT, p_seq BIGINT, p_event_id UUID, p_head BYTEA,
    p_tail BYTEA, p_aggregatetype TEXT, p_clear_outbox BOOLEAN
) RETURNS TABLE (last_read_seq BIGINT, advanced BOOLEAN)
LANGUAGE plpgsql AS $$
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
$$;
