-- A batch of sends with replies against a plain one, at the database alone
-- (scripts/bench-replies; docs/benchmarks.md, "send-load with threads").
--
-- One hot GROUP conversation of 32 members, each of whom has sent one message (user u's
-- is seq u, the root of their thread). Each batch is 16 messages from 16 of the members,
-- as ingest-api's group commit sends them into a hot conversation; in a batch with
-- replies every fifth message replies to its sender's thread (3 or 4 a batch), as
-- send-load --replies 0.2 sends them. The kinds of batch alternate within one session,
-- each committed on its own, and only the statement and its commit are timed: the host's
-- drift reaches every kind alike (pgbench runs of 10 s, one kind after another, moved
-- 15% between runs of the same kind).
--
--   plain         chat_send_many, no reply (what a batch without replies or mentions runs)
--   replies       chat_send_annotated, 3-4 replies (the roots' check, the thread bookkeeping)
--   wrapped       chat_send_annotated, no reply (the wrapper's own cost)
--   many_replies  chat_send_many given the roots (replies written, nothing checked or
--                 recorded: the floor for a batch with replies)
--
-- and, as a batch looks when sends are spread over many conversations (send-load's
-- spread phase commits about 2 sends a batch), two messages into two of 500 more
-- conversations of 32 members, against each other:
--
--   spread        chat_send_many, no reply
--   spread_reply  chat_send_annotated, the first message a reply to its sender's thread

-- Conversation 1 is the hot one, 2..501 the spread ones; in each, user u's message is
-- seq u (the root of u's thread).
INSERT INTO conversation (id, type, title, created_by, member_count)
OVERRIDING SYSTEM VALUE
SELECT c, 'GROUP', CASE WHEN c = 1 THEN 'hot' ELSE 'spread' END, 1, 32
  FROM generate_series(1, 501) AS c;
INSERT INTO conversation_member (conversation_id, user_id)
SELECT c, u FROM generate_series(1, 501) AS c, generate_series(1, 32) AS u;
SELECT count(*) AS roots
  FROM generate_series(1, 501) AS c,
       LATERAL chat_send_many(array_fill(c::BIGINT, ARRAY[32]),
                      ARRAY(SELECT u::BIGINT FROM generate_series(1, 32) AS u ORDER BY u),
                      ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 32)),
                      array_fill('root'::TEXT, ARRAY[32]), array_fill(now(), ARRAY[32]),
                      ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 32)),
                      array_fill('\x00'::BYTEA, ARRAY[32]), array_fill('\x00'::BYTEA, ARRAY[32]),
                      'chat', true, NULL);

-- Runs n batches of each kind, interleaved; answers each kind's mean time per batch
-- (statement and commit) and its rate as a ratio of the plain batch's (of spread's for
-- spread_reply).
CREATE PROCEDURE bench_replies(n INT, INOUT report TEXT DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    kinds CONSTANT TEXT[] := ARRAY['plain', 'replies', 'wrapped', 'many_replies',
                                   'spread', 'spread_reply'];
    spent FLOAT8[] := array_fill(0::FLOAT8, ARRAY[6]);
    started TIMESTAMPTZ;
    k INT;
    answered INT;
    convs BIGINT[] := array_fill(1::BIGINT, ARRAY[16]);
    bodies TEXT[] := array_fill('hello there, a body of a typical length for chat'::TEXT, ARRAY[16]);
    heads BYTEA[] := array_fill('\x0102'::BYTEA, ARRAY[16]);
    tails BYTEA[] := array_fill('\x0304'::BYTEA, ARRAY[16]);
    -- The roots' authors as the cold tier has them: none looked up there.
    cold BIGINT[] := array_fill(NULL::BIGINT, ARRAY[16]);
    senders BIGINT[];
    client_ids UUID[];
    event_ids UUID[];
    created TIMESTAMPTZ[];
    roots BIGINT[];
BEGIN
    FOR round IN 1..n LOOP
        FOR kind IN 1..6 LOOP
            k := (random() * 1000000)::INT;
            senders := ARRAY(SELECT ((k + i) % 32 + 1)::BIGINT FROM generate_series(1, 16) AS i ORDER BY i);
            roots := ARRAY(SELECT CASE WHEN (k + i) % 5 = 0 THEN ((k + i) % 32 + 1)::BIGINT END
                             FROM generate_series(1, 16) AS i ORDER BY i);
            client_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 16));
            event_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 16));
            created := array_fill(now(), ARRAY[16]);
            IF kind >= 5 THEN
                -- Two conversations of the 500, two senders, the first message a reply.
                convs := ARRAY[(k % 250) * 2 + 2, (k % 250) * 2 + 3]::BIGINT[];
                senders := ARRAY[k % 32 + 1, (k + 7) % 32 + 1]::BIGINT[];
                roots := ARRAY[senders[1], NULL]::BIGINT[];
            END IF;
            started := clock_timestamp();
            IF kind = 1 THEN
                SELECT count(*) INTO answered FROM chat_send_many(
                    convs, senders, client_ids, bodies, created, event_ids, heads, tails,
                    'chat', true, NULL);
            ELSIF kind = 2 THEN
                SELECT count(*) INTO answered FROM chat_send_annotated(
                    convs, senders, client_ids, bodies, created, event_ids, heads, tails,
                    'chat', true, roots, cold, '{}'::INT[], '{}'::BIGINT[]);
            ELSIF kind = 3 THEN
                SELECT count(*) INTO answered FROM chat_send_annotated(
                    convs, senders, client_ids, bodies, created, event_ids, heads, tails,
                    'chat', true, NULL, cold, '{}'::INT[], '{}'::BIGINT[]);
            ELSIF kind = 4 THEN
                SELECT count(*) INTO answered FROM chat_send_many(
                    convs, senders, client_ids, bodies, created, event_ids, heads, tails,
                    'chat', true, roots);
            ELSIF kind = 5 THEN
                SELECT count(*) INTO answered FROM chat_send_many(
                    convs, senders, client_ids[1:2], bodies[1:2], created[1:2],
                    event_ids[1:2], heads[1:2], tails[1:2], 'chat', true, NULL);
            ELSE
                SELECT count(*) INTO answered FROM chat_send_annotated(
                    convs, senders, client_ids[1:2], bodies[1:2], created[1:2],
                    event_ids[1:2], heads[1:2], tails[1:2], 'chat', true, roots, cold[1:2],
                    '{}'::INT[], '{}'::BIGINT[]);
            END IF;
            convs := array_fill(1::BIGINT, ARRAY[16]);
            COMMIT;
            spent[kind] := spent[kind] + extract(epoch FROM clock_timestamp() - started);
        END LOOP;
    END LOOP;
    -- Hot kinds against plain, spread_reply against spread.
    SELECT string_agg(format('%s %s ms (%sx)', kinds[i], round((spent[i] * 1000 / n)::NUMERIC, 3),
                             round((spent[CASE WHEN i >= 5 THEN 5 ELSE 1 END] / spent[i])::NUMERIC, 3)),
                      ' | ' ORDER BY i)
      INTO report FROM generate_subscripts(kinds, 1) AS i;
END
$$;
