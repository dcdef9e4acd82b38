-- A batch of sends of which some messages name members or reply in a thread, in one
-- statement like any other batch (measured: as a transaction of five round trips —
-- the delete locks, the roots' check, chat_send_many, the mentions' and the replies'
-- bookkeeping, the commit — a hot conversation with replies ran at 0.53x of plain
-- sends, its rows locked across every round trip).
--
-- chat_send_annotated takes chat_send_many's arguments and, per message, whether a root
-- PostgreSQL no longer holds was found in the cold tier (p_cold_roots), and the members
-- named as pairs (p_mention_at: the message's 1-based place in the batch;
-- p_mention_users). It
--   1. takes the delete locks of the conversations concerned, in id order (the order
--      deletes take them in, before any row lock);
--   2. checks each reply's root: a sender who is no member, and a retry of a message
--      already written (a replay or a conflict, whatever became of its root since),
--      are left to chat_send_many's answer; an unknown seq, a reply, a deleted message
--      is refused; a root moved to the cold tier is refused as 'root_archived' unless
--      the caller looked it up there (p_cold_roots), and the caller then asks again;
--   3. sends the others with chat_send_many;
--   4. records the new messages' mentions and replies;
-- and answers one row per message in batch order, a refused one with its problem.
--
-- The bookkeeping is planned once per connection (measured with
-- pg_stat_statements.track_planning: chat_record_replies spent ~1.3 ms a call planning
-- its statements afresh against message's 16 partitions, more than it spent running
-- them): its functions force generic plans, chat_thread_unread_apply becomes PL/pgSQL
-- (a LANGUAGE sql function is planned at every call before PostgreSQL 18), and
-- chat_record_replies takes the roots' authors from the roots' check instead of looking
-- each root up again.

-- The thread bookkeeping of replies just sent: chat_record_replies of migration
-- 20261205000010, with the roots' authors given (NULL: the root is not in PostgreSQL).
DROP FUNCTION chat_record_replies(BIGINT[], BIGINT[], BIGINT[], BIGINT[], TIMESTAMPTZ[]);
CREATE FUNCTION chat_record_replies(
    p_conversations BIGINT[], p_seqs BIGINT[], p_roots BIGINT[], p_senders BIGINT[],
    p_created_at TIMESTAMPTZ[], p_root_authors BIGINT[]
) RETURNS VOID
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
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
                                     repliers)
    SELECT n.conv, n.root, n.n, n.top, n.top, n.top_at,
           (SELECT coalesce(array_agg(x.s ORDER BY x.o), '{}')
              FROM (SELECT s, min(k) AS o FROM unnest(n.senders) WITH ORDINALITY AS b(s, k)
                     GROUP BY s ORDER BY min(k) LIMIT 3) x)
      FROM (SELECT r.conv, r.root, count(*) AS n, max(r.seq) AS top,
                   (array_agg(r.at ORDER BY r.seq DESC))[1] AS top_at,
                   array_agg(r.sender ORDER BY r.seq) AS senders
              FROM unnest(p_conversations, p_seqs, p_roots, p_senders, p_created_at)
                   AS r(conv, seq, root, sender, at)
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
$$;

-- As in migration 20261205000008, in PL/pgSQL: planned once per connection.
CREATE OR REPLACE FUNCTION chat_thread_unread_apply(
    p_before_conv BIGINT[], p_before_user BIGINT[], p_before_n INT[],
    p_conversations BIGINT[], p_roots BIGINT[]
) RETURNS VOID
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    UPDATE conversation_member m
       SET unread_threads = m.unread_threads + d.delta,
           changed_xid = pg_current_xact_id()
      FROM (SELECT coalesce(a.conversation_id, b.conv) AS conv,
                   coalesce(a.user_id, b.usr) AS usr,
                   coalesce(a.unread, 0) - coalesce(b.n, 0) AS delta
              FROM chat_thread_unread(p_conversations, p_roots) a
              FULL JOIN unnest(p_before_conv, p_before_user, p_before_n) AS b(conv, usr, n)
                ON b.conv = a.conversation_id AND b.usr = a.user_id) d
     WHERE d.delta <> 0 AND m.conversation_id = d.conv AND m.user_id = d.usr;
END
$$;

CREATE OR REPLACE FUNCTION chat_send_annotated(
    p_conversations BIGINT[], p_senders BIGINT[], p_client_ids UUID[], p_bodies TEXT[],
    p_created_at TIMESTAMPTZ[], p_event_ids UUID[], p_heads BYTEA[], p_tails BYTEA[],
    p_aggregatetype TEXT, p_clear_outbox BOOLEAN, p_roots BIGINT[],
    p_cold_roots BOOLEAN[], p_mention_at INT[], p_mention_users BIGINT[]
) RETURNS TABLE (outcome TEXT, seq BIGINT, created_at TIMESTAMPTZ)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_lock BIGINT;
    v_bad TEXT[];
    v_author BIGINT[];
    v_i INT;
    v_problem TEXT;
    v_root_author BIGINT;
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
    v_bad := array_fill(NULL::TEXT, ARRAY[cardinality(p_conversations)]);
    v_author := array_fill(NULL::BIGINT, ARRAY[cardinality(p_conversations)]);
    FOR v_i, v_problem, v_root_author IN
        SELECT r.i,
               CASE WHEN NOT EXISTS (SELECT 1 FROM conversation_member m
                                      WHERE m.conversation_id = r.conv
                                        AND m.user_id = r.sender) THEN NULL
                    WHEN EXISTS (SELECT 1 FROM message s
                                  WHERE s.conversation_id = r.conv
                                    AND s.client_msg_id = r.client_id) THEN NULL
                    WHEN g.seq IS NULL AND r.root <= coalesce(a.cold_through, 0)
                         THEN CASE WHEN r.cold THEN NULL ELSE 'root_archived' END
                    WHEN g.seq IS NULL THEN 'root_unknown'
                    WHEN g.thread_root_seq IS NOT NULL THEN 'root_reply'
                    WHEN g.deleted_at IS NOT NULL THEN 'root_deleted'
               END,
               g.sender_id
          FROM unnest(p_conversations, p_senders, p_client_ids, p_roots, p_cold_roots)
               WITH ORDINALITY AS r(conv, sender, client_id, root, cold, i)
          LEFT JOIN message g ON g.conversation_id = r.conv AND g.seq = r.root
          LEFT JOIN message_archive a ON a.conversation_id = r.conv
         WHERE r.root IS NOT NULL
    LOOP
        v_bad[v_i] := v_problem;
        v_author[v_i] := v_root_author;
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
                              p_clear_outbox, p_roots)
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
                   ARRAY(SELECT p_roots[i] FROM unnest(v_keep) WITH ORDINALITY AS k(i, o) ORDER BY o))
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
$$;
