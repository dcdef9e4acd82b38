-- Threads (issue 29, point 1 and the thread counts of point 2).
--
-- A reply is a message with thread_root_seq: the seq of a top-level message of the same
-- conversation (never a reply, never deleted when the reply is sent). Replies keep the
-- one gapless conversation seq; ordering, gap detection, CDC and sync are unchanged.
--
-- The counts stay arithmetic (migration 20261201000007), every seq in exactly one class:
--   * top-level, not deleted: what unreadCount counts;
--   * top-level, deleted: conversation.deleted_count, member.deleted_read (as before;
--     a deleted reply is no longer counted there);
--   * a reply, deleted or not: conversation.reply_count, member.reply_read (the replies
--     at or below the member's conversation watermark).
-- So unreadCount = (last_seq - deleted_count - reply_count)
--                - (last_read_seq - deleted_read - reply_read),
-- and a watermark move adds the range counts of the deleted top-level seqs and of the
-- replies it passes, over two partial indexes, bounded by the move.
--
-- Per thread (message_thread): the live replies' count, the newest reply (any: a
-- thread read is clamped to it) and the newest live one, its time, the first repliers.
-- Per participant (thread_follow): their thread read position and whether they follow.
-- The root's author and every replier follow on reply; anyone may follow or unfollow.
-- A followed thread is unread while its newest live reply is past the follower's
-- position; conversation_member.unread_threads counts them, moved by one only where a
-- thread's state for a follower flips: a reply (for the followers who had read it all),
-- a thread read that reaches the newest live reply, a follow or unfollow, a delete of a
-- thread's newest live reply. Nothing counts rows to answer the inbox.
--
-- Every change of these takes the conversation's delete lock (pg_advisory_xact_lock):
-- exclusive for sends with replies and for deletes, shared for thread reads and
-- follows, so a thread's newest live reply does not move under a read that compares
-- with it.

ALTER TABLE message
    ADD COLUMN thread_root_seq BIGINT
        CONSTRAINT message_thread_root_before CHECK (thread_root_seq > 0 AND thread_root_seq < seq);

-- A thread's replies in order (thread pages; its newest live reply after a delete).
CREATE INDEX message_reply_idx ON message (conversation_id, thread_root_seq, seq)
    WHERE thread_root_seq IS NOT NULL;
-- The replies a watermark move passes over.
CREATE INDEX message_reply_seq_idx ON message (conversation_id, seq)
    WHERE thread_root_seq IS NOT NULL;
-- The deleted top-level seqs a watermark move passes over (replaces
-- message_deleted_idx, whose rows now include deleted replies).
CREATE INDEX message_deleted_top_idx ON message (conversation_id, seq)
    WHERE deleted_at IS NOT NULL AND thread_root_seq IS NULL;
DROP INDEX message_deleted_idx;

ALTER TABLE conversation
    ADD COLUMN reply_count BIGINT NOT NULL DEFAULT 0 CHECK (reply_count >= 0);

ALTER TABLE conversation_member
    ADD COLUMN reply_read BIGINT NOT NULL DEFAULT 0 CHECK (reply_read >= 0),
    ADD COLUMN unread_threads INT NOT NULL DEFAULT 0
        CONSTRAINT unread_threads_not_negative CHECK (unread_threads >= 0);

CREATE TABLE message_thread (
    conversation_id BIGINT      NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    root_seq        BIGINT      NOT NULL,
    -- Replies not deleted.
    reply_count     BIGINT      NOT NULL DEFAULT 0 CHECK (reply_count >= 0),
    -- The newest reply, deleted or not; 0 before the first.
    last_reply_seq  BIGINT      NOT NULL DEFAULT 0,
    -- The newest reply not deleted, and its time; 0 and NULL when there is none.
    last_live_seq   BIGINT      NOT NULL DEFAULT 0,
    last_reply_at   TIMESTAMPTZ,
    -- The first (up to three) senders of replies not deleted, in the order they first
    -- replied.
    repliers        BIGINT[]    NOT NULL DEFAULT '{}',
    changed_xid     xid8        NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (conversation_id, root_seq),
    CHECK (last_live_seq <= last_reply_seq)
);
CREATE INDEX message_thread_changed ON message_thread (conversation_id, changed_xid);

CREATE TABLE thread_follow (
    conversation_id BIGINT  NOT NULL,
    root_seq        BIGINT  NOT NULL,
    user_id         BIGINT  NOT NULL,
    -- The member has read every reply with seq <= last_read_seq; never decreases.
    last_read_seq   BIGINT  NOT NULL DEFAULT 0,
    following       BOOLEAN NOT NULL,
    changed_xid     xid8    NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (conversation_id, root_seq, user_id),
    FOREIGN KEY (conversation_id, root_seq) REFERENCES message_thread ON DELETE CASCADE,
    -- Leaving takes the member's thread positions with their membership.
    FOREIGN KEY (conversation_id, user_id) REFERENCES conversation_member ON DELETE CASCADE
);
CREATE INDEX thread_follow_by_member ON thread_follow (conversation_id, user_id, changed_xid);

-- The send statement: p_roots (one per message, NULL for a top-level one) is new; a
-- reply is counted in reply_count, and the senders' moves count the replies they pass
-- (those of this batch are not in the statement's snapshot: counted from `fresh`) and
-- no longer count deleted replies as deleted. The roots are checked before, by the
-- caller, under the delete lock (store/threads.rs).
DROP FUNCTION chat_send_many(bigint[], bigint[], uuid[], text[], timestamptz[], uuid[],
                             bytea[], bytea[], text, boolean);
CREATE FUNCTION chat_send_many(
    p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[],
    p_created_at timestamptz[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[],
    p_aggregatetype text, p_clear_outbox boolean, p_roots bigint[] DEFAULT NULL
) RETURNS TABLE(outcome text, seq bigint, created_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode TO 'force_generic_plan'
AS $$
#variable_conflict use_column
BEGIN
    PERFORM FROM conversation c WHERE c.id = ANY (p_conversations) ORDER BY c.id FOR UPDATE;

    RETURN QUERY
    WITH req AS (
        SELECT r.*, cv.last_seq AS top, mem.member IS NOT NULL AS is_member,
               blk.blocked IS NOT NULL AS blocked,
               mem.member IS NOT NULL AND blk.blocked IS NULL AS member,
               s.seq AS s_seq, s.sender_id AS s_sender, s.body AS s_body,
               s.created_at AS s_at
          FROM unnest(p_conversations, p_senders, p_client_ids, p_bodies, p_created_at,
                      p_event_ids, p_heads, p_tails, p_roots)
               WITH ORDINALITY AS r(conv, sender, client_id, body, at, event_id, head,
                                    tail, root, i)
          LEFT JOIN LATERAL (
                SELECT c.last_seq FROM conversation c WHERE c.id = r.conv LIMIT 1) cv ON true
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
               l.tail, l.root,
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
    -- A sender has read what they sent, and passed over the deleted seqs and the
    -- replies on the way.
    reads AS (
        UPDATE conversation_member m
           SET last_read_seq = GREATEST(m.last_read_seq, t.seq),
               deleted_read = m.deleted_read + (
                   SELECT count(*) FROM message d
                    WHERE d.conversation_id = t.conv AND d.deleted_at IS NOT NULL
                      AND d.thread_root_seq IS NULL
                      AND d.seq > m.last_read_seq AND d.seq <= t.seq),
               reply_read = m.reply_read + (
                   SELECT count(*) FROM message d
                    WHERE d.conversation_id = t.conv AND d.thread_root_seq IS NOT NULL
                      AND d.seq > m.last_read_seq AND d.seq <= t.seq) + (
                   SELECT count(*) FROM fresh r
                    WHERE r.conv = t.conv AND r.root IS NOT NULL AND r.seq <= t.seq),
               mention_read = m.mention_read + (
                   SELECT count(*) FROM message_mention n
                    WHERE n.conversation_id = t.conv AND n.user_id = t.sender
                      AND n.seq > m.last_read_seq AND n.seq <= t.seq),
               changed_xid = pg_current_xact_id()
          FROM (SELECT f.conv, f.sender, max(f.seq) AS seq
                  FROM fresh f GROUP BY f.conv, f.sender) AS t
         WHERE m.conversation_id = t.conv AND m.user_id = t.sender
    ),
    -- The events, in (conversation, seq) order, written (and cleared) by the one outbox
    -- write; one row, joined below so that it runs.
    events AS (
        SELECT chat_outbox_write(array_agg(o.event_id), p_aggregatetype,
                                 array_agg(o.conv::TEXT), array_agg('message.new'::TEXT),
                                 array_agg(o.payload), p_clear_outbox) AS written
          FROM (SELECT f.event_id, f.conv, f.head || chat_avro_long(f.seq) || f.tail AS payload
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
$$;

-- The read moves count the replies they pass, and deleted replies no longer as deleted.
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
                  AND d.thread_root_seq IS NULL
                  AND d.seq > m.last_read_seq AND d.seq <= LEAST(b.seq, c.last_seq)),
           reply_read = m.reply_read + (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = m.conversation_id AND d.thread_root_seq IS NOT NULL
                  AND d.seq > m.last_read_seq AND d.seq <= LEAST(b.seq, c.last_seq)),
           mention_read = m.mention_read + (
               SELECT count(*) FROM message_mention n
                WHERE n.conversation_id = m.conversation_id AND n.user_id = m.user_id
                  AND n.seq > m.last_read_seq AND n.seq <= LEAST(b.seq, c.last_seq)),
           changed_xid = pg_current_xact_id()
      FROM unnest(p_conversations, p_users, p_seqs) AS b(conversation_id, user_id, seq)
      JOIN conversation c ON c.id = b.conversation_id
     WHERE m.conversation_id = b.conversation_id
       AND m.user_id = b.user_id
       AND m.last_read_seq < LEAST(b.seq, c.last_seq)
    RETURNING m.conversation_id, m.user_id, m.last_read_seq;
END
$$;

-- Moves conversation_member.unread_threads by the flips of the followed threads
-- (p_conversation, p_roots[i]) for their followers: call it once with p_sign -1 before a
-- change of those threads or their follows, and once with +1 after, in one transaction.
-- Only threads' followers are read; only members whose count changes are written.
-- Private to the functions below.
CREATE FUNCTION chat_thread_unread(p_conversations BIGINT[], p_roots BIGINT[])
RETURNS TABLE (conversation_id BIGINT, user_id BIGINT, unread INT)
LANGUAGE sql STABLE AS $$
    SELECT f.conversation_id, f.user_id, count(*)::INT
      FROM unnest(p_conversations, p_roots) AS r(conv, root)
      JOIN message_thread t ON t.conversation_id = r.conv AND t.root_seq = r.root
      JOIN thread_follow f ON f.conversation_id = r.conv AND f.root_seq = r.root
     WHERE f.following AND t.last_live_seq > f.last_read_seq
     GROUP BY f.conversation_id, f.user_id
$$;

-- Applies the difference between two chat_thread_unread answers (before, after) to the
-- members' counts.
CREATE FUNCTION chat_thread_unread_apply(
    p_before_conv BIGINT[], p_before_user BIGINT[], p_before_n INT[],
    p_conversations BIGINT[], p_roots BIGINT[]
) RETURNS VOID
LANGUAGE sql AS $$
    UPDATE conversation_member m
       SET unread_threads = m.unread_threads + d.delta,
           changed_xid = pg_current_xact_id()
      FROM (SELECT coalesce(a.conversation_id, b.conv) AS conv,
                   coalesce(a.user_id, b.usr) AS usr,
                   coalesce(a.unread, 0) - coalesce(b.n, 0) AS delta
              FROM chat_thread_unread(p_conversations, p_roots) a
              FULL JOIN unnest(p_before_conv, p_before_user, p_before_n) AS b(conv, usr, n)
                ON b.conv = a.conversation_id AND b.usr = a.user_id) d
     WHERE d.delta <> 0 AND m.conversation_id = d.conv AND m.user_id = d.usr
$$;

-- Records the replies just sent (created rows only: conversation, seq, root, sender,
-- time each): the threads' summaries, the senders' and the roots' authors' follows
-- (a sender has read the thread up to their reply), and the followers' unread_threads.
-- The caller holds each conversation's delete lock exclusive and its row lock.
CREATE FUNCTION chat_record_replies(
    p_conversations BIGINT[], p_seqs BIGINT[], p_roots BIGINT[], p_senders BIGINT[],
    p_created_at TIMESTAMPTZ[]
) RETURNS VOID
LANGUAGE plpgsql AS $$
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
      JOIN message g ON g.conversation_id = x.c AND g.seq = x.r
      JOIN conversation_member m ON m.conversation_id = x.c AND m.user_id = g.sender_id
    ON CONFLICT DO NOTHING;

    PERFORM chat_thread_unread_apply(b_conv, b_user, b_n, v_conv, v_root);
END
$$;

-- A reply (p_conversation, p_seq) of thread p_root just deleted: the thread's summary
-- without it, and the followers for whom the thread is read now. The caller holds the
-- delete lock exclusive and has erased the row.
CREATE FUNCTION chat_reply_deleted(p_conversation BIGINT, p_root BIGINT, p_seq BIGINT)
RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    b_conv BIGINT[];
    b_user BIGINT[];
    b_n INT[];
BEGIN
    SELECT array_agg(u.conversation_id), array_agg(u.user_id), array_agg(u.unread)
      INTO b_conv, b_user, b_n
      FROM chat_thread_unread(ARRAY[p_conversation], ARRAY[p_root]) u;
    UPDATE message_thread t
       SET reply_count = t.reply_count - 1,
           last_live_seq = coalesce(l.seq, 0),
           last_reply_at = l.created_at,
           repliers = (SELECT coalesce(array_agg(x.sender_id ORDER BY x.first), '{}')
                         FROM (SELECT g.sender_id, min(g.seq) AS first FROM message g
                                WHERE g.conversation_id = p_conversation
                                  AND g.thread_root_seq = p_root AND g.deleted_at IS NULL
                                GROUP BY g.sender_id ORDER BY min(g.seq) LIMIT 3) x),
           changed_xid = pg_current_xact_id()
      FROM (SELECT NULL) AS one
      LEFT JOIN LATERAL (
            SELECT g.seq, g.created_at FROM message g
             WHERE g.conversation_id = p_conversation AND g.thread_root_seq = p_root
               AND g.deleted_at IS NULL
             ORDER BY g.seq DESC LIMIT 1) l ON true
     WHERE t.conversation_id = p_conversation AND t.root_seq = p_root;
    PERFORM chat_thread_unread_apply(b_conv, b_user, b_n, ARRAY[p_conversation], ARRAY[p_root]);
END
$$;

-- A member's thread read, follow or unfollow: p_seq moves their position (monotone,
-- clamped to the thread's newest reply; NULL leaves it), p_following sets whether they
-- follow (NULL leaves it; a new row follows only if asked to). The thread must exist
-- (store/threads.rs makes it for a follow of a message without replies). Answers the
-- position and following after, and the member's unread_threads; no row when there is
-- no such thread or member.
CREATE FUNCTION chat_thread_position(
    p_conversation BIGINT, p_root BIGINT, p_user BIGINT, p_seq BIGINT, p_following BOOLEAN
) RETURNS TABLE (last_read_seq BIGINT, following BOOLEAN, unread_threads INT)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_top BIGINT;
    v_live BIGINT;
    v_read BIGINT;
    v_following BOOLEAN;
    v_new_read BIGINT;
    v_new_following BOOLEAN;
    v_delta INT;
    v_changed BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_conversation);
    SELECT t.last_reply_seq, t.last_live_seq INTO v_top, v_live FROM message_thread t
     WHERE t.conversation_id = p_conversation AND t.root_seq = p_root;
    IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM conversation_member m
                                 WHERE m.conversation_id = p_conversation
                                   AND m.user_id = p_user) THEN
        RETURN;
    END IF;
    -- A new position starts where the thread is: nothing in it is unread to someone
    -- who just started following it (or read it).
    INSERT INTO thread_follow (conversation_id, root_seq, user_id, last_read_seq, following)
    VALUES (p_conversation, p_root, p_user, v_top, false)
    ON CONFLICT DO NOTHING;
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
        RETURNING v_new_read, v_new_following, m.unread_threads;
    ELSE
        RETURN QUERY
        SELECT v_new_read, v_new_following, m.unread_threads FROM conversation_member m
         WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
    END IF;
END
$$;
