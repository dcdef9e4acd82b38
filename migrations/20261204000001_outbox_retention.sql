-- Outbox rows kept until their events are seen on chat.events (outbox.retain_until_confirmed),
-- and a way to publish them again when the WAL that carried them is lost (a replication
-- slot dropped, a restore, a failover without failover slots). docs/operations.md,
-- "Re-publishing the outbox".
--
-- `position` orders the rows as they were written: a conversation's sends take its row
-- lock, so its events get increasing positions in seq order. A Debezium incremental
-- snapshot reads the table in chunks of this key (the signal's surrogate-key) and so
-- publishes each conversation's events again in the order they were first streamed.
ALTER TABLE outbox ADD COLUMN position BIGINT GENERATED ALWAYS AS IDENTITY;
CREATE UNIQUE INDEX outbox_position ON outbox (position);

-- Debezium's signalling table (signal.data.collection of the connector): an operator's
-- INSERT of an `execute-snapshot` row starts an incremental snapshot; the connector writes
-- its snapshot windows' watermarks here too, so it may insert. The services may not.
CREATE TABLE debezium_signal (
    id   VARCHAR(64) PRIMARY KEY,
    type VARCHAR(32) NOT NULL,
    data VARCHAR(2048)
);
REVOKE ALL ON debezium_signal FROM chatpipe_service;
GRANT SELECT, INSERT ON debezium_signal TO chatpipe_cdc;

-- The connector streams inserts only: the auditor's batched deletes of confirmed rows never
-- reach the WAL decoder's output (Debezium's EventRouter would only log and drop them).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_publication p JOIN pg_roles r ON r.oid = p.pubowner
                WHERE p.pubname = 'chatpipe_outbox' AND r.rolname = current_user) THEN
        IF NOT EXISTS (SELECT 1 FROM pg_publication_tables
                        WHERE pubname = 'chatpipe_outbox' AND tablename = 'debezium_signal') THEN
            ALTER PUBLICATION chatpipe_outbox ADD TABLE debezium_signal;
        END IF;
        ALTER PUBLICATION chatpipe_outbox SET (publish = 'insert');
    END IF;
END
$$;
