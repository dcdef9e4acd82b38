CREATE OR REPLACE FUNCTION public.chat_record_replies(p_conversations bigint[], p_seqs bigint[], p_roots bigint[], p_senders bigint[], p_created_at timestamp with time zone[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_conv BIGINT[];
    v_root BIGINT[];
    b_conv BIGINT[];
    b_user BIGINT[];
    b_n INT[];
BEGIN
    SELECT array_agg(t.conv), array_agg(t.root) INTO v_conv, v_root
      FROM (SELECT DISTINCT r.conv, r.root
              FROM unnest(p_conversations, p_roots) AS r(conv, root)) t;
    INSERT INTO message_thread (conversation_id, root_seq)
    SELECT c, r FROM unnest(v_conv, v_root) AS x(c, r)
    ON CONFLICT DO NOTHING;
    SELECT array_agg(u.conversation_id), array_agg(u.user_id), array_agg(u.unread)
      INTO b_conv, b_user, b_n
      FROM chat_thread_unread(v_conv, v_root) u;

    -- The summaries. Repliers: the first three, new ones appended in seq order.
    UPDATE message_thread t
       SET reply_count = t.reply_count + n.n,
           last_reply_seq = n.top,
           last_live_seq = n.top,
           last_reply_at = n.top_at,
           repliers = (SELECT coalesce(array_agg(x.u ORDER BY x.o), '{}')
                         FROM (SELECT u, min(o) AS o
                                 FROM (SELECT u, o FROM unnest(t.repliers) WITH ORDINALITY AS a(u, o)
                                       UNION ALL
                                       SELECT s, 100 + k FROM unnest(n.senders) WITH ORDINALITY AS b(s, k)) y
                                GROUP BY u ORDER BY min(o) LIMIT 3) x),
           changed_xid = pg_current_xact_id()
      FROM (SELECT r.conv, r.root, count(*) AS n, max(r.seq) AS top,
                   (array_agg(r.at ORDER BY r.seq DESC))[1] AS top_at,
                   array_agg(r.sender ORDER BY r.seq) AS senders
              FROM unnest(p_conversations, p_seqs, p_roots, p_senders, p_created_at)
                   AS r(conv, seq, root, sender, at)
             GROUP BY r.conv, r.root) n
     WHERE t.conversation_id = n.conv AND t.root_seq = n.root;

    -- The senders follow, having read up to their newest reply.
    INSERT INTO thread_follow AS f (conversation_id, root_seq, user_id, last_read_seq, following)
    SELECT r.conv, r.root, r.sender, max(r.seq), true
      FROM unnest(p_conversations, p_seqs, p_roots, p_senders) AS r(conv, seq, root, sender)
     GROUP BY r.conv, r.root, r.sender
    ON CONFLICT (conversation_id, root_seq, user_id) DO UPDATE
       SET last_read_seq = GREATEST(f.last_read_seq, excluded.last_read_seq),
           following = true, changed_xid = pg_current_xact_id();
    -- The root's author follows from the first reply on (a member still; their choice
    -- stands once they have a row).
    INSERT INTO thread_follow (conversation_id, root_seq, user_id, last_read_seq, following)
    SELECT x.c, x.r, g.sender_id, 0, true
      FROM unnest(v_conv, v_root) AS x(c, r)
      CROSS JOIN LATERAL (
            SELECT g.sender_id FROM message g
             WHERE g.conversation_id = x.c AND g.seq = x.r
             OFFSET 0) g
     WHERE EXISTS (SELECT 1 FROM conversation_member m
                    WHERE m.conversation_id = x.c AND m.user_id = g.sender_id)
    ON CONFLICT DO NOTHING;

    PERFORM chat_thread_unread_apply(b_conv, b_user, b_n, v_conv, v_root);
END
$function$;
