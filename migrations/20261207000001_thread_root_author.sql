-- A thread knows its root's author (message_thread.root_sender_id), also once the root
-- has left PostgreSQL for the cold tier.
--
-- The notifications processor told a member at level 'mentions' of a reply to their
-- message by finding the root in `message`; a root moved to Cassandra was not there,
-- so its author was not told. And a reply to a root found in the cold tier did not make
-- the root's author follow the thread, as a reply to a hot root does: the send did not
-- know who that was. Now the send route passes the author the cold tier has
-- (chat_send_annotated's p_cold_authors, in place of p_cold_roots: NULL where the root
-- was not looked up there), chat_record_replies keeps it with the thread and makes them
-- follow, and the notifications processor reads it from message_thread.
--
-- Threads made before this migration get their root's author from `message`. One whose
-- root had already moved keeps NULL: its author is not told of a reply as such (a
-- mention, or their level 'all', still tells them).
ALTER TABLE message_thread ADD COLUMN root_sender_id BIGINT;
UPDATE message_thread t SET root_sender_id = g.sender_id
  FROM message g
 WHERE g.conversation_id = t.conversation_id AND g.seq = t.root_seq;

DROP FUNCTION chat_send_annotated(BIGINT[], BIGINT[], UUID[], TEXT[], TIMESTAMPTZ[], UUID[],
                                  BYTEA[], BYTEA[], TEXT, BOOLEAN, BIGINT[], BOOLEAN[],
                                  INT[], BIGINT[]);

CREATE FUNCTION chat_send_annotated(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[], p_cold_authors bigint[], p_mention_at integer[], p_mention_users bigint[])
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
$function$;

CREATE OR REPLACE FUNCTION chat_record_replies(p_conversations bigint[], p_seqs bigint[], p_roots bigint[], p_senders bigint[], p_created_at timestamp with time zone[], p_root_authors bigint[])
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

CREATE OR REPLACE FUNCTION chat_thread_position(p_conversation bigint, p_root bigint, p_user bigint, p_seq bigint, p_following boolean)
 RETURNS TABLE(last_read_seq bigint, following boolean, unread_threads integer, changed boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_top BIGINT;
    v_live BIGINT;
    v_created INT;
    v_read BIGINT;
    v_following BOOLEAN;
    v_new_read BIGINT;
    v_new_following BOOLEAN;
    v_delta INT;
    v_changed BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_conversation);
    IF NOT EXISTS (SELECT 1 FROM conversation_member m
                    WHERE m.conversation_id = p_conversation AND m.user_id = p_user) THEN
        RETURN;
    END IF;
    -- A top-level message nobody replied to yet can be followed (and read).
    INSERT INTO message_thread (conversation_id, root_seq, root_sender_id)
    SELECT p_conversation, p_root, g.sender_id FROM message g
     WHERE g.conversation_id = p_conversation AND g.seq = p_root
       AND g.thread_root_seq IS NULL AND g.deleted_at IS NULL
    ON CONFLICT DO NOTHING;
    SELECT t.last_reply_seq, t.last_live_seq INTO v_top, v_live FROM message_thread t
     WHERE t.conversation_id = p_conversation AND t.root_seq = p_root;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A new position starts where the thread is: nothing in it is unread to someone
    -- who just started following it (or read it).
    INSERT INTO thread_follow (conversation_id, root_seq, user_id, last_read_seq, following)
    VALUES (p_conversation, p_root, p_user, v_top, false)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_created = ROW_COUNT;
    SELECT f.last_read_seq, f.following INTO v_read, v_following FROM thread_follow f
     WHERE f.conversation_id = p_conversation AND f.root_seq = p_root AND f.user_id = p_user
       FOR UPDATE;
    v_new_read := GREATEST(v_read, LEAST(coalesce(p_seq, v_read), v_top));
    v_new_following := coalesce(p_following, v_following);
    v_changed := v_new_read <> v_read OR v_new_following <> v_following;
    IF v_changed THEN
        UPDATE thread_follow f
           SET last_read_seq = v_new_read, following = v_new_following,
               changed_xid = pg_current_xact_id()
         WHERE f.conversation_id = p_conversation AND f.root_seq = p_root
           AND f.user_id = p_user;
    END IF;
    v_delta := (v_new_following AND v_live > v_new_read)::INT
             - (v_following AND v_live > v_read)::INT;
    -- The member's row carries the change to sync (and the count, if it moved).
    IF v_changed THEN
        RETURN QUERY
        UPDATE conversation_member m
           SET unread_threads = m.unread_threads + v_delta, changed_xid = pg_current_xact_id()
         WHERE m.conversation_id = p_conversation AND m.user_id = p_user
        RETURNING v_new_read, v_new_following, m.unread_threads, true;
    ELSE
        RETURN QUERY
        SELECT v_new_read, v_new_following, m.unread_threads, v_created > 0
          FROM conversation_member m
         WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
    END IF;
END
$function$;
