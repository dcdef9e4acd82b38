CREATE OR REPLACE FUNCTION public.chat_send_annotated(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[], p_cold_authors bigint[], p_mention_at integer[], p_mention_users bigint[], p_traceparents text[] DEFAULT NULL::text[])
 RETURNS TABLE(outcome text, seq bigint, created_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    v_lock BIGINT;
    v_bad TEXT[];
    v_author BIGINT[];
    v_i INT;
    v_root_author BIGINT;
    v_root_parent BIGINT;
    v_root_deleted BOOLEAN;
    v_conv BIGINT;
    v_root BIGINT;
    v_sender BIGINT;
    v_client UUID;
    v_found BOOLEAN;
    v_keep INT[];
    v_out TEXT[];
    v_seq BIGINT[];
    v_at TIMESTAMPTZ[];
BEGIN
    FOR v_lock IN
        SELECT DISTINCT p_conversations[i]
          FROM generate_subscripts(p_conversations, 1) AS i
         WHERE p_roots[i] IS NOT NULL OR i = ANY (p_mention_at)
         ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_lock);
    END LOOP;

    -- The roots' check, for the replies only; v_bad[i] and v_author[i] for message i.
    -- One lookup per reply by its own (conversation, root): a generic plan prunes
    -- message's partitions to one at executor start-up (a join on the batch's
    -- conversations would start an index scan on all 16 for every call). The sender's
    -- membership and a retry are looked at only for a root that fails.
    v_bad := array_fill(NULL::TEXT, ARRAY[cardinality(p_conversations)]);
    v_author := array_fill(NULL::BIGINT, ARRAY[cardinality(p_conversations)]);
    FOR v_i IN SELECT i FROM generate_subscripts(p_roots, 1) AS i WHERE p_roots[i] IS NOT NULL
    LOOP
        v_conv := p_conversations[v_i];
        v_root := p_roots[v_i];
        SELECT g.thread_root_seq, g.deleted_at IS NOT NULL, g.sender_id
          INTO v_root_parent, v_root_deleted, v_root_author
          FROM message g WHERE g.conversation_id = v_conv AND g.seq = v_root;
        v_found := FOUND;
        IF v_found AND v_root_parent IS NULL AND NOT v_root_deleted THEN
            v_author[v_i] := v_root_author;
            CONTINUE;
        END IF;
        v_sender := p_senders[v_i];
        v_client := p_client_ids[v_i];
        IF NOT EXISTS (SELECT 1 FROM conversation_member m
                        WHERE m.conversation_id = v_conv AND m.user_id = v_sender)
           OR EXISTS (SELECT 1 FROM message s
                       WHERE s.conversation_id = v_conv AND s.client_msg_id = v_client) THEN
            CONTINUE;
        END IF;
        IF NOT v_found THEN
            v_bad[v_i] := CASE
                WHEN v_root <= coalesce((SELECT a.cold_through FROM message_archive a
                                          WHERE a.conversation_id = v_conv), 0)
                THEN CASE WHEN p_cold_authors[v_i] IS NOT NULL THEN NULL
                          ELSE 'root_archived' END
                ELSE 'root_unknown' END;
            v_author[v_i] := p_cold_authors[v_i];
        ELSIF v_root_parent IS NOT NULL THEN
            v_bad[v_i] := 'root_reply';
        ELSE
            v_bad[v_i] := 'root_deleted';
        END IF;
    END LOOP;

    IF array_position(v_bad, NULL) IS NULL THEN
        -- Every message refused.
        v_out := v_bad;
    ELSIF NOT EXISTS (SELECT FROM unnest(v_bad) AS b WHERE b IS NOT NULL) THEN
        SELECT array_agg(s.outcome ORDER BY s.k), array_agg(s.seq ORDER BY s.k),
               array_agg(s.created_at ORDER BY s.k)
          INTO v_out, v_seq, v_at
          FROM chat_send_many(p_conversations, p_senders, p_client_ids, p_bodies,
                              p_created_at, p_event_ids, p_heads, p_tails, p_aggregatetype,
                              p_clear_outbox, p_roots, p_traceparents)
               WITH ORDINALITY AS s(outcome, seq, created_at, k);
    ELSE
        -- The messages not refused, sent; their answers back to their batch places.
        v_keep := ARRAY(SELECT i FROM generate_subscripts(v_bad, 1) AS i
                         WHERE v_bad[i] IS NULL ORDER BY i);
        SELECT array_agg(s.outcome ORDER BY s.k), array_agg(s.seq ORDER BY s.k),
               array_agg(s.created_at ORDER BY s.k)
          INTO v_out, v_seq, v_at
          FROM chat_send_many(
                   ARRAY(SELECT p_conversations[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_senders[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_client_ids[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_bodies[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_created_at[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_event_ids[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_heads[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_tails[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   p_aggregatetype, p_clear_outbox,
                   ARRAY(SELECT p_roots[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o),
                   ARRAY(SELECT p_traceparents[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o))
               WITH ORDINALITY AS s(outcome, seq, created_at, k);
        SELECT array_agg(coalesce(v_bad[b.i], v_out[k.o]) ORDER BY b.i),
               array_agg(v_seq[k.o] ORDER BY b.i), array_agg(v_at[k.o] ORDER BY b.i)
          INTO v_out, v_seq, v_at
          FROM generate_subscripts(p_conversations, 1) AS b(i)
          LEFT JOIN unnest(v_keep) WITH ORDINALITY AS k(i, o) ON k.i = b.i;
    END IF;

    IF p_mention_at IS NOT NULL AND cardinality(p_mention_at) > 0 THEN
        PERFORM chat_record_mentions(array_agg(p_conversations[n.at]), array_agg(v_seq[n.at]),
                                     array_agg(n.usr), array_agg(p_senders[n.at]),
                                     array_agg(v_at[n.at]))
           FROM unnest(p_mention_at, p_mention_users) AS n(at, usr)
          WHERE v_out[n.at] = 'created'
         HAVING count(*) > 0;
    END IF;
    PERFORM chat_record_replies(array_agg(p_conversations[i]), array_agg(v_seq[i]),
                                array_agg(p_roots[i]), array_agg(p_senders[i]),
                                array_agg(v_at[i]), array_agg(v_author[i]))
       FROM generate_subscripts(p_conversations, 1) AS i
      WHERE p_roots[i] IS NOT NULL AND v_out[i] = 'created'
     HAVING count(*) > 0;

    RETURN QUERY
    SELECT v_out[i], v_seq[i], v_at[i]
      FROM generate_subscripts(p_conversations, 1) AS i
     ORDER BY i;
END
$function$;
