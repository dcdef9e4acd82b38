-- chatpipe's roles on a PostgreSQL server, run by a superuser (or a role with CREATEROLE
-- and REPLICATION) before the first migration; running it again changes nothing.
-- scripts/stack and docker-compose.yml run it, then set the logins' passwords.
--
--   chatpipe_service  what ingest-api and the pipeline connect as: rows and functions of
--                     the chatpipe schema (granted by migration 20261203000004), no DDL,
--                     no roles, no databases, no replication.
--   chatpipe_cdc      what Debezium connects as: REPLICATION, and SELECT on the outbox
--                     alone (same migration). The publication is made by the migrations.
--
-- Both log in here. In production, make a login role per service instead and
-- GRANT chatpipe_service TO it (its pg_stat_activity rows then say which service).
-- The schema's owner (the role that runs `ingest-api migrate`) is neither.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chatpipe_service') THEN
        CREATE ROLE chatpipe_service;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chatpipe_cdc') THEN
        CREATE ROLE chatpipe_cdc;
    END IF;
END
$$;
ALTER ROLE chatpipe_service LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE chatpipe_cdc LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
