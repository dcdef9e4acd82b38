-- Deletes with exact unread counts, and what one-call sync reads.
--
-- Deletes. A deleted message keeps its seq (seqs stay gapless) and loses its body: the
-- column is NULL exactly when deleted_at is set, so an erased body cannot linger.
ALTER TABLE message ALTER COLUMN body DROP NOT NULL;
ALTER TABLE message ADD COLUMN deleted_at TIMESTAMPTZ;
ALTER TABLE message ADD COLUMN deleted_by BIGINT;
ALTER TABLE message ADD CONSTRAINT message_body_erased_when_deleted
    CHECK ((deleted_at IS NULL) = (body IS NOT NULL) AND (deleted_at IS NULL) = (deleted_by IS NULL));
-- The deleted seqs of a conversation, for counting those a watermark passes over.
CREATE INDEX message_deleted_idx ON message (conversation_id, seq) WHERE deleted_at IS NOT NULL;

-- Exact unread without counting rows (invariant 7 stays a subtraction):
--   unread = (last_seq - deleted_count) - (last_read_seq - deleted_read)
-- deleted_count: deleted messages of the conversation. deleted_read: how many of them a
-- member's watermark has passed (seq <= last_read_seq). A delete adds one to the
-- conversation and to every member whose watermark is at or past the seq; a watermark
-- that moves adds the deleted seqs it passed over (a range count on message_deleted_idx,
-- bounded by the move, never by history). A delete and a watermark move of the same
-- conversation serialize on the transaction-level advisory lock keyed by the
-- conversation id: deletes take it exclusive, watermark moves shared (moves do not wait
-- for each other), each before the statements whose snapshot must see the other.
-- Sends move their sender's watermark under the conversation's row lock, which deletes
-- take too.
ALTER TABLE conversation ADD COLUMN deleted_count BIGINT NOT NULL DEFAULT 0
    CHECK (deleted_count >= 0 AND deleted_count <= last_seq);
ALTER TABLE conversation_member ADD COLUMN deleted_read BIGINT NOT NULL DEFAULT 0
    CHECK (deleted_read >= 0 AND deleted_read <= last_read_seq);

-- Sync. A sync cursor is a PostgreSQL snapshot (pg_current_snapshot() of the sync's own
-- REPEATABLE READ transaction); a row changed since the cursor is one whose last
-- writer's transaction id is not visible in it. Every change sync reports writes
-- changed_xid in the same transaction: new, edited and deleted messages on the message;
-- sends, edits, deletes and membership on the conversation; watermark moves, joins and
-- role changes on the member. Rows from before this migration keep NULL, which counts
-- as visible in every cursor (no table rewrite).
ALTER TABLE message ADD COLUMN changed_xid xid8;
ALTER TABLE message ALTER COLUMN changed_xid SET DEFAULT pg_current_xact_id();
ALTER TABLE conversation ADD COLUMN changed_xid xid8;
ALTER TABLE conversation ALTER COLUMN changed_xid SET DEFAULT pg_current_xact_id();
ALTER TABLE conversation_member ADD COLUMN changed_xid xid8;
ALTER TABLE conversation_member ALTER COLUMN changed_xid SET DEFAULT pg_current_xact_id();
-- Edited and deleted messages by when they changed: sync finds changes below the newest
-- messages without reading history. Plain sends never enter this index.
CREATE INDEX message_changed_idx ON message (conversation_id, changed_xid)
    WHERE edited_at IS NOT NULL OR deleted_at IS NOT NULL;

-- Who left which conversation, and when: sync tells a member that was removed (or left
-- from another device) that the conversation is gone. One row per (user, conversation);
-- joining again deletes it.
CREATE TABLE conversation_departure (
    user_id         BIGINT NOT NULL,
    conversation_id BIGINT NOT NULL REFERENCES conversation (id) ON DELETE CASCADE,
    departed_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    changed_xid     xid8 NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (user_id, conversation_id)
);

-- Whether a row last written by transaction `xid` changed after `cursor` was taken.
CREATE FUNCTION chat_changed_since(xid xid8, cursor pg_snapshot) RETURNS BOOLEAN
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT xid IS NOT NULL AND NOT pg_visible_in_snapshot(xid, cursor) $$;

-- chat_send_many as 20261201000003 made it, with three changes: the sender's watermark
-- move counts the deleted seqs it passes, the conversation records the transaction that
-- changed it, and a retry of a message deleted since is answered as a replay.
CREATE OR REPLACE FUNCTION chat_send_many(
    p_conversations BIGINT[],
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
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM FROM conversation c WHERE c.id = ANY (p_conversations) ORDER BY c.id FOR UPDATE;

    RETURN QUERY
    WITH req AS (
        SELECT r.*, cv.last_seq AS top, mem.member IS NOT NULL AS member,
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
               changed_xid = pg_current_xact_id()
          FROM (SELECT f.conv, f.sender, max(f.seq) AS seq
                  FROM fresh f GROUP BY f.conv, f.sender) AS t
         WHERE m.conversation_id = t.conv AND m.user_id = t.sender
    ),
    events AS (
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT f.event_id, p_aggregatetype, f.conv::TEXT, 'message.new',
               f.head || chat_avro_long(f.seq) || f.tail
          FROM fresh f
         ORDER BY f.conv, f.seq
    )
    SELECT CASE WHEN NOT l.member THEN 'not_member'
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
      LEFT JOIN fresh f ON f.i = l.i
      LEFT JOIN fresh e ON f.i IS NULL AND l.s_seq IS NULL
                       AND e.conv = l.conv AND e.client_id = l.client_id
     ORDER BY l.i;

    IF p_clear_outbox THEN
        DELETE FROM outbox o WHERE o.id = ANY (p_event_ids);
    END IF;
END
$$;

-- chat_mark_read as 20261201000004 made it, taking the conversation's shared delete
-- lock first and counting the deleted seqs its watermark passes over.
CREATE OR REPLACE FUNCTION chat_mark_read(
    p_conversation  BIGINT,
    p_user          BIGINT,
    p_seq           BIGINT,
    p_event_id      UUID,
    p_head          BYTEA,
    p_tail          BYTEA,
    p_aggregatetype TEXT,
    p_clear_outbox  BOOLEAN
) RETURNS TABLE (last_read_seq BIGINT, advanced BOOLEAN)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    moved_to BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_conversation);
    UPDATE conversation_member m
       SET last_read_seq = LEAST(p_seq, c.last_seq),
           deleted_read = m.deleted_read + (
               SELECT count(*) FROM message d
                WHERE d.conversation_id = p_conversation AND d.deleted_at IS NOT NULL
                  AND d.seq > m.last_read_seq AND d.seq <= LEAST(p_seq, c.last_seq)),
           changed_xid = pg_current_xact_id()
      FROM conversation c
     WHERE c.id = p_conversation
       AND m.conversation_id = p_conversation AND m.user_id = p_user
       AND m.last_read_seq < LEAST(p_seq, c.last_seq)
    RETURNING m.last_read_seq INTO moved_to;
    IF NOT FOUND THEN
        RETURN QUERY SELECT m.last_read_seq, FALSE FROM conversation_member m
                      WHERE m.conversation_id = p_conversation AND m.user_id = p_user;
        RETURN;
    END IF;
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    VALUES (p_event_id, p_aggregatetype, p_conversation::TEXT, 'read.updated',
            p_head || chat_avro_long(moved_to) || p_tail);
    IF p_clear_outbox THEN
        DELETE FROM outbox o WHERE o.id = p_event_id;
    END IF;
    RETURN QUERY SELECT moved_to, TRUE;
END
$$;
