-- The send statement on the partitioned `message` against the same statement on an
-- unpartitioned copy, at the database alone (scripts/bench-partitions; docs/benchmarks.md,
-- "What the partitions cost the send statement").
--
-- message_flat is `message` without partitions (same columns, indexes and constraints)
-- and chat_send_many_flat is chat_send_many writing and reading it instead. If the
-- scratch database has a chat_send_many_before (an earlier definition, given to the
-- script), it runs too. 500 conversations of 32 members, each member's first message
-- sent; then, per batch, either 16 messages from 16 members into conversation 1 (a hot
-- conversation's batch) or 2 messages into two of the others (a spread batch, as
-- send-load's spread phase commits 1-3 a statement). The kinds run in turn, their
-- order rotating each round, each batch committed on its own; only the call and its
-- commit are timed, so the host's drift reaches every kind alike.
INSERT INTO conversation (id, type, title, created_by, member_count)
OVERRIDING SYSTEM VALUE
SELECT c, 'GROUP', 'bench', 1, 32 FROM generate_series(1, 501) AS c;
INSERT INTO conversation_member (conversation_id, user_id)
SELECT c, u FROM generate_series(1, 501) AS c, generate_series(1, 32) AS u;
SELECT count(*) AS firsts
  FROM generate_series(1, 501) AS c,
       LATERAL chat_send_many(array_fill(c::BIGINT, ARRAY[32]),
                      ARRAY(SELECT u::BIGINT FROM generate_series(1, 32) AS u ORDER BY u),
                      ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 32)),
                      array_fill('first'::TEXT, ARRAY[32]), array_fill(now(), ARRAY[32]),
                      ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 32)),
                      array_fill('\x00'::BYTEA, ARRAY[32]), array_fill('\x00'::BYTEA, ARRAY[32]),
                      'chat', true, NULL);

CREATE TABLE message_flat (LIKE message INCLUDING ALL);
ALTER TABLE message_flat ADD FOREIGN KEY (conversation_id) REFERENCES conversation (id)
    ON DELETE CASCADE;
INSERT INTO message_flat SELECT * FROM message;
DO $$
DECLARE
    src TEXT := pg_get_functiondef('chat_send_many'::regproc);
BEGIN
    src := replace(src, 'FUNCTION public.chat_send_many(', 'FUNCTION public.chat_send_many_flat(');
    src := regexp_replace(src, '(INTO|FROM) message ', '\1 message_flat ', 'g');
    EXECUTE src;
END
$$;

-- Runs n rounds of batches of `width` (16: the hot conversation; otherwise spread) of
-- each kind; answers each kind's mean time per batch and its ratio to chat_send_many's.
CREATE PROCEDURE bench_partitions(n INT, width INT, INOUT report TEXT DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    with_before CONSTANT BOOLEAN := to_regproc('chat_send_many_before') IS NOT NULL;
    kinds CONSTANT TEXT[] := CASE WHEN with_before
                                  THEN ARRAY['partitioned', 'unpartitioned', 'before']
                                  ELSE ARRAY['partitioned', 'unpartitioned'] END;
    spent FLOAT8[] := array_fill(0::FLOAT8, ARRAY[3]);
    started TIMESTAMPTZ;
    kind INT;
    k INT;
    answered INT;
    convs BIGINT[];
    senders BIGINT[];
    client_ids UUID[];
    event_ids UUID[];
    bodies TEXT[] := array_fill('hello there, a body of a typical length for chat'::TEXT, ARRAY[width]);
    heads BYTEA[] := array_fill('\x0102'::BYTEA, ARRAY[width]);
    tails BYTEA[] := array_fill('\x0304'::BYTEA, ARRAY[width]);
    created TIMESTAMPTZ[] := array_fill(now(), ARRAY[width]);
BEGIN
    FOR round IN 1..n LOOP
        FOR j IN 0..cardinality(kinds) - 1 LOOP
            kind := (j + round) % cardinality(kinds) + 1;
            k := (random() * 1000000)::INT;
            senders := ARRAY(SELECT ((k + i) % 32 + 1)::BIGINT FROM generate_series(1, width) AS i ORDER BY i);
            IF width = 16 THEN
                convs := array_fill(1::BIGINT, ARRAY[16]);
            ELSE
                convs := ARRAY(SELECT ((k + i * 37) % 500 + 2)::BIGINT
                                 FROM generate_series(1, width) AS i ORDER BY 1);
            END IF;
            client_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, width));
            event_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, width));
            started := clock_timestamp();
            IF kind = 1 THEN
                SELECT count(*) INTO answered FROM chat_send_many(convs, senders, client_ids,
                    bodies, created, event_ids, heads, tails, 'chat', true, NULL);
            ELSIF kind = 2 THEN
                SELECT count(*) INTO answered FROM chat_send_many_flat(convs, senders, client_ids,
                    bodies, created, event_ids, heads, tails, 'chat', true, NULL);
            ELSE
                -- Resolved when it runs: only when the function exists.
                SELECT count(*) INTO answered FROM chat_send_many_before(convs, senders, client_ids,
                    bodies, created, event_ids, heads, tails, 'chat', true, NULL);
            END IF;
            COMMIT;
            spent[kind] := spent[kind] + extract(epoch FROM clock_timestamp() - started);
        END LOOP;
    END LOOP;
    SELECT format('width %s: ', width)
           || string_agg(format('%s %s ms (%sx)', kinds[i], round((spent[i] * 1000 / n)::NUMERIC, 3),
                                round((spent[i] / spent[1])::NUMERIC, 3)), ' | ' ORDER BY i)
      INTO report FROM generate_subscripts(kinds, 1) AS i;
END
$$;
