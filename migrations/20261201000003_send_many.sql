-- chat_send_many: one statement for a batch of messages into any number of
-- conversations, so sends spread over many conversations share one commit (one WAL
-- flush, one round trip) as sends into one conversation already did. It replaces
-- chat_send, with the same answers; one row answers each message, in input order.
--
-- Measured with pgbench on this schema (10,000 conversations of 3 members, -M prepared,
-- one run, two rounds; messages per second):
--   one message per call, 16 clients:      chat_send 922 / 757, chat_send_many 895 / 732
--   several conversations per transaction: chat_send 4 calls in one transaction
--                                          1,092 / 1,053; chat_send_many with 8
--                                          messages into 8 conversations 4,035 / 3,644
--   one conversation, 8 clients:           chat_send_many 247 / 276, chat_send 298 / 280
-- and chat_send as 20261201000002 left it fell from 223 to 154 while the conversation's
-- history grew to 2,700 messages: its generic plan joined the batch to the messages and
-- the members as hash joins, reading every message of the conversation on every call.
-- Here every lookup is an index probe.
DROP FUNCTION chat_send(BIGINT, BIGINT[], UUID[], TEXT[], TIMESTAMPTZ[], UUID[], BYTEA[],
                        BYTEA[], TEXT, BOOLEAN);

CREATE FUNCTION chat_send_many(
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
    -- The locks first, in conversation id order: two batches that share conversations
    -- cannot deadlock on them. The next statement takes its snapshot after the locks are
    -- granted (READ COMMITTED), so it sees a concurrent retry of the same client id as a
    -- replay and a membership removed meanwhile as removed.
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
          -- Every lookup LATERAL with LIMIT 1: one index probe per message, whatever
          -- the generic plan guesses about the batch's size.
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
    -- Each member's message against what is stored under its client id, and its place
    -- among the batch's member messages with that client id (the first one counts).
    looked AS (
        SELECT q.*,
               row_number() OVER (PARTITION BY q.conv, q.member, q.client_id
                                  ORDER BY q.i) AS nth
          FROM req q
    ),
    -- The new messages take each conversation's next seqs, gapless, in batch order.
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
           SET last_seq = l.seq, last_message_at = l.at, last_activity_at = l.at
          FROM (SELECT DISTINCT ON (f.conv) f.conv, f.seq, f.at
                  FROM fresh f ORDER BY f.conv, f.seq DESC) AS l
         WHERE c.id = l.conv
    ),
    -- A sender has read what they sent.
    reads AS (
        UPDATE conversation_member m
           SET last_read_seq = GREATEST(m.last_read_seq, t.seq)
          FROM (SELECT f.conv, f.sender, max(f.seq) AS seq
                  FROM fresh f GROUP BY f.conv, f.sender) AS t
         WHERE m.conversation_id = t.conv AND m.user_id = t.sender
    ),
    -- Each conversation's events in seq order: the order Debezium reads them in.
    events AS (
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT f.event_id, p_aggregatetype, f.conv::TEXT, 'message.new',
               f.head || chat_avro_long(f.seq) || f.tail
          FROM fresh f
         ORDER BY f.conv, f.seq
    )
    -- A member's message that is not new repeats a stored one, or an earlier one of this
    -- batch: a replay when sender and body match, a conflict otherwise.
    SELECT CASE WHEN NOT l.member THEN 'not_member'
                WHEN f.seq IS NOT NULL THEN 'created'
                WHEN coalesce(l.s_sender, e.sender) = l.sender
                 AND coalesce(l.s_body, e.body) = l.body THEN 'replayed'
                ELSE 'conflict' END,
           CASE WHEN l.member THEN coalesce(f.seq, l.s_seq, e.seq) END,
           CASE WHEN l.member THEN coalesce(f.at, l.s_at, e.at) END
      FROM looked l
      LEFT JOIN fresh f ON f.i = l.i
      LEFT JOIN fresh e ON f.i IS NULL AND l.s_seq IS NULL
                       AND e.conv = l.conv AND e.client_id = l.client_id
     ORDER BY l.i;

    IF p_clear_outbox THEN
        -- Rows a sibling part of the statement inserted are not visible to it: a
        -- statement of its own. Ids of messages that were not new match nothing.
        DELETE FROM outbox o WHERE o.id = ANY (p_event_ids);
    END IF;
END
$$;
