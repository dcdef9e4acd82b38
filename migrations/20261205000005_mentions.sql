-- Mentions (issue 29, point 3): a message may name members; each named member has a
-- row in message_mention while the message names them, and an exact count of unread
-- mentions per conversation kept as the delete work keeps unread (migration
-- 20261201000007): conversation_member.mention_count (their mention rows) and
-- mention_read (those at or below their read watermark), so mentionCount is
-- mention_count - mention_read, read from the member's row, never counted.
--
-- What moves them:
--   * a mention recorded (chat_record_mentions, in the send's transaction, for the
--     batches that have any) or taken away by an edit or a delete (chat_set_mentions):
--     mention_count by one, and mention_read by one where the seq is at or below the
--     watermark;
--   * a watermark move (chat_advance_reads, and the sender's move inside chat_send_many):
--     mention_read by the range count of their mention rows it passes, over the primary
--     key (conversation_id, user_id, seq), bounded by the move;
--   * leaving: the member's rows go with their membership.
-- Rows hold the message's sender and time, so a user's mentions list (GET /mentions)
-- reads one index, whichever tier the message body is in.

CREATE TABLE message_mention (
    conversation_id bigint      NOT NULL,
    user_id         bigint      NOT NULL,
    seq             bigint      NOT NULL,
    sender_id       bigint      NOT NULL,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (conversation_id, user_id, seq)
);
CREATE INDEX message_mention_by_user
    ON message_mention (user_id, created_at DESC, conversation_id DESC, seq DESC);

ALTER TABLE conversation_member
    ADD COLUMN mention_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN mention_read  bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT mention_read_within CHECK (0 <= mention_read AND mention_read <= mention_count);

-- Records the mentions of messages just sent: (conversation, seq) of each message,
-- repeated per named user, with the message's sender and time. Only current members
-- other than the sender are recorded. Returns how many rows it wrote.
--
-- The caller holds, in this order, each conversation's delete lock exclusive
-- (pg_advisory_xact_lock, taken before the send statement, in id order, the order
-- deletes take it in) and its row lock (the send's). A watermark move takes the delete
-- lock shared before its UPDATE, so it either counts these rows (it starts after this
-- commits) or has moved the watermark before they are counted here (m.last_read_seq
-- below is the row as it is when locked).
CREATE FUNCTION chat_record_mentions(
    p_conversations BIGINT[], p_seqs BIGINT[], p_users BIGINT[], p_senders BIGINT[],
    p_created_at TIMESTAMPTZ[]
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    written BIGINT;
BEGIN
    WITH wanted AS (
        SELECT DISTINCT w.conv, w.usr, w.seq, w.sender, w.at
          FROM unnest(p_conversations, p_seqs, p_users, p_senders, p_created_at)
               AS w(conv, seq, usr, sender, at)
         WHERE w.usr <> w.sender
    ),
    ins AS (
        INSERT INTO message_mention (conversation_id, user_id, seq, sender_id, created_at)
        SELECT w.conv, w.usr, w.seq, w.sender, w.at
          FROM wanted w
          JOIN conversation_member m ON m.conversation_id = w.conv AND m.user_id = w.usr
        ON CONFLICT DO NOTHING
        RETURNING conversation_id, user_id, seq
    ),
    counted AS (
        UPDATE conversation_member m
           SET mention_count = m.mention_count + cardinality(i.seqs),
               mention_read = m.mention_read
                   + (SELECT count(*) FROM unnest(i.seqs) AS s WHERE s <= m.last_read_seq),
               changed_xid = pg_current_xact_id()
          FROM (SELECT i.conversation_id, i.user_id, array_agg(i.seq) AS seqs
                  FROM ins i GROUP BY i.conversation_id, i.user_id) i
         WHERE m.conversation_id = i.conversation_id AND m.user_id = i.user_id
        RETURNING 1
    )
    SELECT count(*) INTO written FROM ins;
    RETURN written;
END
$$;

-- Sets the members message (p_conversation, p_seq) names to p_users (an edit; '{}' for
-- a delete): rows of users no longer named go, rows of newly named members come, and
-- both counters follow. Call it holding the conversation's delete lock exclusive and the
-- message's row lock, as edits and deletes do. Returns the users named afterwards,
-- ascending.
CREATE FUNCTION chat_set_mentions(
    p_conversation BIGINT, p_seq BIGINT, p_users BIGINT[]
) RETURNS BIGINT[]
LANGUAGE plpgsql AS $$
DECLARE
    v_sender BIGINT;
    v_at TIMESTAMPTZ;
    v_named BIGINT[];
BEGIN
    SELECT sender_id, created_at INTO v_sender, v_at FROM message
     WHERE conversation_id = p_conversation AND seq = p_seq;
    WITH gone AS (
        DELETE FROM message_mention n
         WHERE n.conversation_id = p_conversation AND n.seq = p_seq
           AND n.user_id <> ALL (p_users)
        RETURNING n.user_id
    )
    UPDATE conversation_member m
       SET mention_count = m.mention_count - 1,
           mention_read = m.mention_read - (p_seq <= m.last_read_seq)::int,
           changed_xid = pg_current_xact_id()
      FROM gone g
     WHERE m.conversation_id = p_conversation AND m.user_id = g.user_id;
    WITH came AS (
        INSERT INTO message_mention (conversation_id, user_id, seq, sender_id, created_at)
        SELECT p_conversation, m.user_id, p_seq, v_sender, v_at
          FROM conversation_member m
         WHERE m.conversation_id = p_conversation AND m.user_id = ANY (p_users)
           AND m.user_id <> v_sender
        ON CONFLICT DO NOTHING
        RETURNING user_id
    )
    UPDATE conversation_member m
       SET mention_count = m.mention_count + 1,
           mention_read = m.mention_read + (p_seq <= m.last_read_seq)::int,
           changed_xid = pg_current_xact_id()
      FROM came c
     WHERE m.conversation_id = p_conversation AND m.user_id = c.user_id;
    SELECT coalesce(array_agg(n.user_id ORDER BY n.user_id), '{}') INTO v_named
      FROM message_mention n WHERE n.conversation_id = p_conversation AND n.seq = p_seq;
    RETURN v_named;
END
$$;

-- The read moves count the mentions they pass (the only change to both functions is
-- the mention_read line).
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

CREATE OR REPLACE FUNCTION chat_send_many(p_conversations bigint[], p_senders bigint[], p_client_ids uuid[], p_bodies text[], p_created_at timestamp with time zone[], p_event_ids uuid[], p_heads bytea[], p_tails bytea[], p_aggregatetype text, p_clear_outbox boolean)
 RETURNS TABLE(outcome text, seq bigint, created_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
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
                      p_event_ids, p_heads, p_tails)
               WITH ORDINALITY AS r(conv, sender, client_id, body, at, event_id, head,
                                    tail, i)
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
               l.tail, l.top + row_number() OVER (PARTITION BY l.conv ORDER BY l.i) AS seq
          FROM looked l
         WHERE l.member AND l.s_seq IS NULL AND l.nth = 1
    ),
    ins AS (
        INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at)
        SELECT f.conv, f.seq, f.sender, f.client_id, f.body, f.at FROM fresh f
    ),
    conv AS (
        UPDATE conversation c
           SET last_seq = l.seq, last_message_at = l.at, last_activity_at = l.at,
               changed_xid = pg_current_xact_id()
          FROM (SELECT DISTINCT ON (f.conv) f.conv, f.seq, f.at
                  FROM fresh f ORDER BY f.conv, f.seq DESC) AS l
         WHERE c.id = l.conv
    ),
    -- A sender has read what they sent, and passed over the deleted seqs on the way.
    reads AS (
        UPDATE conversation_member m
           SET last_read_seq = GREATEST(m.last_read_seq, t.seq),
               deleted_read = m.deleted_read + (
                   SELECT count(*) FROM message d
                    WHERE d.conversation_id = t.conv AND d.deleted_at IS NOT NULL
                      AND d.seq > m.last_read_seq AND d.seq <= t.seq),
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
$function$;
