CREATE OR REPLACE FUNCTION public.chat_send_many(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[] DEFAULT NULL::bigint[], p_traceparents text[] DEFAULT NULL::text[])
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
