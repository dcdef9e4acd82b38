CREATE OR REPLACE FUNCTION chat_send_v1(
    p_conversation  BIGINT,
    p_senders       BIGINT[],
    p_client_ids    UUID[],
    p_bodies        TEXT[],
    p_created_at    TIMESTAMPTZ[],
    p_event_ids     UUID[],
    p_heads         BYTEA[],
    p_tails         BYTEA[],
    p_aggregatetype TEXT,
    p_clear_outbox  BOOLEAN
) RETURNS TABLE (outcome TEXT, seq BIGINT, created_at TIMESTAMPTZ)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n         INTEGER := cardinality(p_senders);
    top       BIGINT;
    members   BIGINT[];
    -- Messages with the batch's client ids: those stored, then those of this batch.
    known_ids UUID[];
    known_seq BIGINT[];
    known_by  BIGINT[];
    known_bd  TEXT[];
    known_at  TIMESTAMPTZ[];
    outcomes  TEXT[]        := '{}';
    seqs      BIGINT[]      := '{}';
    ats       TIMESTAMPTZ[] := '{}';
    new_idx   INTEGER[]     := '{}';
    new_seq   BIGINT[]      := '{}';
    k         INTEGER;
BEGIN
    SELECT c.last_seq INTO top FROM conversation c WHERE c.id = p_conversation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_member'::TEXT, NULL::BIGINT, NULL::TIMESTAMPTZ
                       FROM generate_series(1, n);
        RETURN;
    END IF;
    SELECT coalesce(array_agg(m.user_id), '{}') INTO members
      FROM conversation_member m
     WHERE m.conversation_id = p_conversation AND m.user_id = ANY (p_senders);
    SELECT coalesce(array_agg(x.client_msg_id), '{}'), coalesce(array_agg(x.seq), '{}'),
           coalesce(array_agg(x.sender_id), '{}'), coalesce(array_agg(x.body), '{}'),
           coalesce(array_agg(x.created_at), '{}')
      INTO known_ids, known_seq, known_by, known_bd, known_at
      FROM message x
     WHERE x.conversation_id = p_conversation AND x.client_msg_id = ANY (p_client_ids);

    FOR i IN 1 .. n LOOP
        k := array_position(known_ids, p_client_ids[i]);
        IF NOT p_senders[i] = ANY (members) THEN
            outcomes := outcomes || 'not_member'::TEXT;
            seqs := seqs || NULL::BIGINT;
            ats := ats || NULL::TIMESTAMPTZ;
        ELSIF k IS NOT NULL THEN
            outcomes := outcomes || CASE WHEN known_by[k] = p_senders[i] AND known_bd[k] = p_bodies[i]
                                         THEN 'replayed' ELSE 'conflict' END;
            seqs := seqs || known_seq[k];
            ats := ats || known_at[k];
        ELSE
            top := top + 1;
            outcomes := outcomes || 'created'::TEXT;
            seqs := seqs || top;
            ats := ats || p_created_at[i];
            new_idx := new_idx || i;
            new_seq := new_seq || top;
            known_ids := known_ids || p_client_ids[i];
            known_seq := known_seq || top;
            known_by := known_by || p_senders[i];
            known_bd := known_bd || p_bodies[i];
            known_at := known_at || p_created_at[i];
        END IF;
    END LOOP;

    IF cardinality(new_idx) > 0 THEN
        INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at)
        SELECT p_conversation, t.s, p_senders[t.i], p_client_ids[t.i], p_bodies[t.i], p_created_at[t.i]
          FROM unnest(new_idx, new_seq) AS t(i, s);
        UPDATE conversation c
           SET last_seq = top,
               last_message_at = p_created_at[new_idx[cardinality(new_idx)]],
               last_activity_at = p_created_at[new_idx[cardinality(new_idx)]]
         WHERE c.id = p_conversation;
        -- A sender has read what they sent.
        UPDATE conversation_member m
           SET last_read_seq = GREATEST(m.last_read_seq, t.s)
          FROM (SELECT p_senders[u.i] AS user_id, max(u.s) AS s
                  FROM unnest(new_idx, new_seq) AS u(i, s) GROUP BY 1) AS t
         WHERE m.conversation_id = p_conversation AND m.user_id = t.user_id;
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT p_event_ids[t.i], p_aggregatetype, p_conversation::TEXT, 'message.new',
               p_heads[t.i] || chat_avro_long(t.s) || p_tails[t.i]
          FROM unnest(new_idx, new_seq) WITH ORDINALITY AS t(i, s, o)
         ORDER BY t.o;
        IF p_clear_outbox THEN
            DELETE FROM outbox o
             WHERE o.id IN (SELECT p_event_ids[t.i] FROM unnest(new_idx) AS t(i));
        END IF;
    END IF;

    RETURN QUERY SELECT t.o, t.s, t.a FROM unnest(outcomes, seqs, ats) WITH ORDINALITY AS t(o, s, a, n)
                  ORDER BY t.n;
END
$$;
