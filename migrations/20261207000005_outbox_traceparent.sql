-- The trace context of each event (issue 30): `outbox.traceparent`, a W3C `traceparent`
-- (`00-<trace id>-<span id>-<flags>`) of the span that wrote the event, NULL when the
-- writer exports no traces. Debezium's EventRouter carries it into a `traceparent`
-- header on chat.events (config/stack/chatpipe-outbox-connector.json), where fanout
-- continues the trace and hands it on to the gateway in the lists' headers.
--
-- The sends name one per message (`p_traceparents`, in batch order, beside the other
-- per-message arrays): a group-commit statement writes many requests' events, each in its
-- own request's trace. The new parameter is last and defaults to NULL, so the calls
-- without it (an ingest-api of the previous release during a rolling upgrade, the other
-- writers of chat_outbox_write) stay as they were; a function's arguments are part of its
-- name, so each is dropped and created again.
ALTER TABLE outbox ADD COLUMN traceparent TEXT;

DROP FUNCTION chat_outbox_write(uuid[], text, text[], text[], bytea[], boolean);
DROP FUNCTION chat_send_many(bigint[], bigint[], uuid[], text[], timestamp with time zone[], uuid[], bytea[], bytea[], text, boolean, bigint[]);
DROP FUNCTION chat_send_annotated(bigint[], bigint[], uuid[], text[], timestamp with time zone[], uuid[], bytea[], bytea[], text, boolean, bigint[], bigint[], integer[], bigint[]);

CREATE FUNCTION chat_outbox_write(p_ids uuid[], p_aggregatetype text, p_keys text[], p_types text[], p_payloads bytea[], p_clear boolean, p_traceparents text[] DEFAULT NULL::text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
    SELECT e.i, p_aggregatetype, e.k, e.t, e.p, e.tp
      FROM unnest(p_ids, p_keys, p_types, p_payloads, p_traceparents)
           WITH ORDINALITY AS e(i, k, t, p, tp, n)
     ORDER BY e.n;
    IF p_clear THEN
        DELETE FROM outbox o WHERE o.id = ANY (p_ids);
    END IF;
END
$function$;

CREATE FUNCTION chat_send_many(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[] DEFAULT NULL::bigint[], p_traceparents text[] DEFAULT NULL::text[])
 RETURNS TABLE(outcome text, seq bigint, created_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM FROM conversation c WHERE c.id = ANY (p_conversations) ORDER BY c.id FOR UPDATE;

    RETURN QUERY
    WITH req AS (
        SELECT r.*, cv.last_seq AS top, cv.deleted_count AS top_deleted,
               cv.reply_count AS top_replies, mem.member IS NOT NULL AS is_member,
               blk.blocked IS NOT NULL AS blocked,
               mem.member IS NOT NULL AND blk.blocked IS NULL AS member,
               s.seq AS s_seq, s.sender_id AS s_sender, s.body AS s_body,
               s.created_at AS s_at
          FROM unnest(p_conversations, p_senders, p_client_ids, p_bodies, p_created_at,
                      p_event_ids, p_heads, p_tails, p_roots, p_traceparents)
               WITH ORDINALITY AS r(conv, sender, client_id, body, at, event_id, head,
                                    tail, root, traceparent, i)
          LEFT JOIN LATERAL (
                SELECT c.last_seq, c.deleted_count, c.reply_count FROM conversation c
                 WHERE c.id = r.conv LIMIT 1) cv ON true
          LEFT JOIN LATERAL (
                SELECT true AS member FROM conversation_member m
                 WHERE m.conversation_id = r.conv AND m.user_id = r.sender
                 LIMIT 1) mem ON true
          -- A DIRECT conversation in which either member blocked the other.
          LEFT JOIN LATERAL (
                SELECT true AS blocked FROM direct_pair p JOIN user_block b
                    ON (b.blocker_id, b.blocked_id) IN ((p.user_low, p.user_high),
                                                        (p.user_high, p.user_low))
                 WHERE p.conversation_id = r.conv
                 LIMIT 1) blk ON true
          LEFT JOIN LATERAL (
                SELECT s.seq, s.sender_id, s.body, s.created_at FROM message s
                 WHERE s.conversation_id = r.conv AND s.client_msg_id = r.client_id
                 LIMIT 1) s ON true
    ),
    looked AS (
        SELECT q.*,
               row_number() OVER (PARTITION BY q.conv, q.member, q.client_id
                                  ORDER BY q.i) AS nth
          FROM req q
    ),
    fresh AS (
        SELECT l.i, l.conv, l.sender, l.client_id, l.body, l.at, l.event_id, l.head,
               l.tail, l.root, l.traceparent, l.top_deleted, l.top_replies,
               l.top + row_number() OVER (PARTITION BY l.conv ORDER BY l.i) AS seq
          FROM looked l
         WHERE l.member AND l.s_seq IS NULL AND l.nth = 1
    ),
    ins AS (
        INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at,
                             thread_root_seq)
        SELECT f.conv, f.seq, f.sender, f.client_id, f.body, f.at, f.root FROM fresh f
    ),
    conv AS (
        UPDATE conversation c
           SET last_seq = l.seq, last_message_at = l.at, last_activity_at = l.at,
               reply_count = c.reply_count + l.replies,
               changed_xid = pg_current_xact_id()
          FROM (SELECT DISTINCT ON (f.conv) f.conv, f.seq, f.at,
                       count(f.root) OVER (PARTITION BY f.conv) AS replies
                  FROM fresh f ORDER BY f.conv, f.seq DESC) AS l
         WHERE c.id = l.conv
    ),
    -- A sender has read what they sent, and so passed every seq the conversation had
    -- before this statement: all its deleted top-level seqs and all its replies (the
    -- conversation's counts, read under its row lock), and the replies of this batch
    -- up to their own (migration 20261207000003).
    reads AS (
        UPDATE conversation_member m
           SET last_read_seq = GREATEST(m.last_read_seq, t.seq),
               deleted_read = t.top_deleted,
               reply_read = t.top_replies + (
                   SELECT count(*) FROM fresh r
                    WHERE r.conv = t.conv AND r.root IS NOT NULL AND r.seq <= t.seq),
               mention_read = m.mention_read + (
                   SELECT count(*) FROM message_mention n
                    WHERE n.conversation_id = t.conv AND n.user_id = t.sender
                      AND n.seq > m.last_read_seq AND n.seq <= t.seq),
               changed_xid = pg_current_xact_id()
          FROM (SELECT f.conv, f.sender, max(f.seq) AS seq,
                       max(f.top_deleted) AS top_deleted, max(f.top_replies) AS top_replies
                  FROM fresh f GROUP BY f.conv, f.sender) AS t
         WHERE m.conversation_id = t.conv AND m.user_id = t.sender
    ),
    -- The events, in (conversation, seq) order, written (and cleared) by the one outbox
    -- write; one row, joined below so that it runs.
    events AS (
        SELECT chat_outbox_write(array_agg(o.event_id), p_aggregatetype,
                                 array_agg(o.conv::TEXT), array_agg('message.new'::TEXT),
                                 array_agg(o.payload), p_clear_outbox,
                                 array_agg(o.traceparent)) AS written
          FROM (SELECT f.event_id, f.conv, f.head || chat_avro_long(f.seq) || f.tail AS payload,
                       f.traceparent
                  FROM fresh f ORDER BY f.conv, f.seq) o
    )
    SELECT CASE WHEN NOT l.is_member THEN 'not_member'
                WHEN l.blocked THEN 'blocked'
                WHEN f.seq IS NOT NULL THEN 'created'
                -- A retry of a message deleted since is a replay: its body is gone,
                -- its client id still names it.
                WHEN coalesce(l.s_sender, e.sender) = l.sender
                 AND (coalesce(l.s_body, e.body) = l.body
                      OR (l.s_seq IS NOT NULL AND l.s_body IS NULL)) THEN 'replayed'
                ELSE 'conflict' END,
           CASE WHEN l.member THEN coalesce(f.seq, l.s_seq, e.seq) END,
           CASE WHEN l.member THEN coalesce(f.at, l.s_at, e.at) END
      FROM looked l
     CROSS JOIN events
      LEFT JOIN fresh f ON f.i = l.i
      LEFT JOIN fresh e ON f.i IS NULL AND l.s_seq IS NULL
                       AND e.conv = l.conv AND e.client_id = l.client_id
     ORDER BY l.i;
END
$function$;

CREATE FUNCTION chat_send_annotated(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[], p_cold_authors bigint[], p_mention_at integer[], p_mention_users bigint[], p_traceparents text[] DEFAULT NULL::text[])
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
