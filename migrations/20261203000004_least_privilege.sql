-- Least privilege. The services do not own the schema: they connect as members of
-- chatpipe_service, which may read and write rows and call the functions, and nothing
-- else (no DDL, no roles, no replication). Debezium connects as a member of chatpipe_cdc:
-- REPLICATION (given where the login role is made, config/postgres/roles.sql) and SELECT
-- on the outbox alone. Migrations run as the schema's owner (`ingest-api migrate`).
--
-- The roles are the cluster's, not this database's: config/postgres/roles.sql makes them
-- with their logins before the first migration. Where they are missing (a server set up
-- by hand), they are made here without login, when the migrating role may make roles.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chatpipe_service') THEN
        CREATE ROLE chatpipe_service NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chatpipe_cdc') THEN
        CREATE ROLE chatpipe_cdc NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO chatpipe_service, chatpipe_cdc;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO chatpipe_service;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO chatpipe_service;
-- The migrations' own ledger: the services read it (to refuse a schema older than
-- their build) and never write it.
REVOKE INSERT, UPDATE, DELETE ON _sqlx_migrations FROM chatpipe_service;
-- Tables and sequences later migrations make (as the same owner) get the same grants.
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO chatpipe_service;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO chatpipe_service;

GRANT SELECT ON outbox TO chatpipe_cdc;

-- The publication Debezium streams (publication.name in
-- config/stack/chatpipe-outbox-connector.json): made here by the outbox's owner, since
-- chatpipe_cdc may not (publication.autocreate.mode = disabled). A database where an
-- earlier connector made it keeps that one.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'chatpipe_outbox') THEN
        CREATE PUBLICATION chatpipe_outbox FOR TABLE outbox;
    END IF;
END
$$;
