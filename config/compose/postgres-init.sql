-- docker-compose.yml: the schema registry keeps its schemas (and so the ids every
-- record carries) in a database of its own, beside chatpipe's.
CREATE DATABASE apicurio;
