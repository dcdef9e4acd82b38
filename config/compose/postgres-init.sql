-- docker-compose.yml, after config/postgres/roles.sql: the logins' passwords, and the
-- schema registry's own database (its schemas, so the ids every record carries),
-- owned by a role of its own that can reach nothing of chatpipe's.
ALTER ROLE chatpipe_service PASSWORD 'chatpipe-service-compose-secret';
ALTER ROLE chatpipe_cdc PASSWORD 'chatpipe-cdc-compose-secret';
CREATE ROLE chatpipe_registry LOGIN PASSWORD 'chatpipe-registry-compose-secret';
CREATE DATABASE apicurio OWNER chatpipe_registry;
REVOKE CONNECT ON DATABASE chatpipe FROM PUBLIC;
GRANT CONNECT ON DATABASE chatpipe TO chatpipe_service, chatpipe_cdc;
