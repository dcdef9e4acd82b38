CREATE OR REPLACE FUNCTION public.chat_record_replies(p_conversations bigint[], p_seqs bigint[], p_roots bigint[], p_senders bigint[], p_created_at timestamp with time zone[], p_root_authors bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
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
    -- Who had the threads unread before (a thread without a row has no follower).
    SELECT array_agg(u.conversation_id), array_agg(u.user_id), array_agg(u.unread)
      INTO b_conv, b_user, b_n
      FROM chat_thread_unread(v_conv, v_root) u;

    -- The summaries, created by the first reply. Repliers: the first three, new ones
    -- appended in seq order.
    INSERT INTO message_thread AS t (conversation_id, root_seq, reply_count,
                                     last_reply_seq, last_live_seq, last_reply_at,
                                     repliers, root_sender_id)
    SELECT n.conv, n.root, n.n, n.top, n.top, n.top_at,
           (SELECT coalesce(array_agg(x.s ORDER BY x.o), '{}')
              FROM (SELECT s, min(k) AS o FROM unnest(n.senders) WITH ORDINALITY AS b(s, k)
                     GROUP BY s ORDER BY min(k) LIMIT 3) x),
           n.author
      FROM (SELECT r.conv, r.root, count(*) AS n, max(r.seq) AS top,
                   (array_agg(r.at ORDER BY r.seq DESC))[1] AS top_at,
                   array_agg(r.sender ORDER BY r.seq) AS senders, max(r.author) AS author
              FROM unnest(p_conversations, p_seqs, p_roots, p_senders, p_created_at,
                          p_root_authors)
                   AS r(conv, seq, root, sender, at, author)
             GROUP BY r.conv, r.root) n
    ON CONFLICT (conversation_id, root_seq) DO UPDATE
       SET reply_count = t.reply_count + excluded.reply_count,
           last_reply_seq = excluded.last_reply_seq,
           last_live_seq = excluded.last_live_seq,
           last_reply_at = excluded.last_reply_at,
           repliers = (SELECT coalesce(array_agg(x.u ORDER BY x.o), '{}')
                         FROM (SELECT u, min(o) AS o
                                 FROM (SELECT u, o FROM unnest(t.repliers) WITH ORDINALITY AS a(u, o)
                                       UNION ALL
                                       SELECT s, 100 + k FROM unnest(excluded.repliers) WITH ORDINALITY AS b(s, k)) y
                                GROUP BY u ORDER BY min(o) LIMIT 3) x),
           root_sender_id = coalesce(t.root_sender_id, excluded.root_sender_id),
           changed_xid = pg_current_xact_id();

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
    SELECT DISTINCT x.c, x.r, x.author, 0, true
      FROM unnest(p_conversations, p_roots, p_root_authors) AS x(c, r, author)
     WHERE x.author IS NOT NULL
       AND EXISTS (SELECT 1 FROM conversation_member m
                    WHERE m.conversation_id = x.c AND m.user_id = x.author)
    ON CONFLICT DO NOTHING;

    PERFORM chat_thread_unread_apply(b_conv, b_user, b_n, v_conv, v_root);
END
$function$;
